"""Every shipped kernel (kernels_ptx/*.sasm, as installed package data) builds with its default
parameters, assembles with ptxas for sm_90, and neither spills nor uses local memory."""
import pytest

from asmgemm.pipeline import BuildOptions, assemble, build_file, shipped_kernels
from asmgemm.toolchain import find_tool

KERNELS = shipped_kernels()


def test_kernels_ship_as_package_data():
    assert "sgemm_naive" in KERNELS
    for name, path in KERNELS.items():
        assert path.is_file(), f"{name}: {path} is listed but not a file"


# sm_90, or sm_90a for the kernels on wgmma/setmaxnreg (what a build without --target picks)
TARGET = {"hgemm": "sm_90a"}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_builds_to_ptx(name):
    target = TARGET.get(name, "sm_90")
    result = build_file(name, BuildOptions(target=target))
    assert result.target == target
    assert build_file(name).target == target
    assert result.kernel_names, f"{name} defines no .entry"
    assert f".target {target}\n" in result.ptx
    # Same input, byte-identical output.
    assert build_file(name, BuildOptions(target=target)).ptx == result.ptx


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_assembles_without_spills(name):
    result = build_file(name, BuildOptions(target=TARGET.get(name, "sm_90")))
    asm = assemble(result)
    assert asm.cubin[:4] == b"\x7fELF"
    by_name = {k.name: k for k in asm.kernels}
    for kernel in result.kernel_names:
        res = by_name[kernel]
        assert res.registers > 0
        assert res.spill_stores == 0 and res.spill_loads == 0, f"{kernel} spills: {res}"
        assert res.stack_frame == 0 and res.local_bytes == 0, f"{kernel} uses local memory: {res}"
