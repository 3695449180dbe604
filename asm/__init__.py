"""asmgemm: a GPU assembler toolkit for hand-written GEMM kernels (PTX macro-assembly, .sasm)."""
from .version import __version__     # asmgemm.__version__ for users; the stages import asmgemm.version


def __getattr__(name):
    # `asmgemm.gemm` loads the CuPy runtime on first use only: `import asmgemm` never imports CuPy.
    if name == "gemm":
        from .runtime.gemm import gemm
        globals()["gemm"] = gemm     # found directly from now on: no lookup hook per call
        return gemm
    if name == "grouped_gemm":
        from .runtime.grouped import grouped_gemm
        globals()["grouped_gemm"] = grouped_gemm
        return grouped_gemm
    raise AttributeError(f"module 'asmgemm' has no attribute '{name}'")
