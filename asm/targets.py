"""Which targets a build accepts: the targets asmgemm models (isa/arch.py: MODELLED_TARGETS) and
every sm_* target the ptxas in use assembles (toolchain.py: ptxas_targets), or, without a ptxas,
the list the `cuda-tools` extra's ptxas gives. It asks the toolchain, so it sits above isa/ and
toolchain.py; isa/arch.py's `arch_for` describes a target without asking whether it builds.

    SUPPORTED_TARGETS                  every accepted name, in order (asked when first looked at)
    require_supported_target("sm_80")  AsmError listing the accepted ones for any other name
"""
from __future__ import annotations

from collections.abc import Sequence

from .errors import AsmError
from .isa.arch import MODELLED_TARGETS, target_number
from .toolchain import ptxas_targets

# What `ptxas --help` of nvidia-cuda-nvcc 13.0.88 (the `cuda-tools` extra) lists for --gpu-name:
# the accepted targets when no ptxas can be asked. A ptxas that can be asked is the judge.
PTXAS_FALLBACK_TARGETS: tuple[str, ...] = (
    "sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_90a",
    "sm_100", "sm_100a", "sm_100f", "sm_103", "sm_103a", "sm_103f", "sm_110", "sm_110a", "sm_110f",
    "sm_120", "sm_120a", "sm_120f", "sm_121", "sm_121a", "sm_121f")


def _target_order(name: str) -> tuple[int, int]:
    number, suffix = target_number(name)
    return number, " af".index(suffix or " ")


def supported_targets() -> tuple[str, ...]:
    """Every `.target` / --target asmgemm accepts, in order: the modelled targets, and every sm_*
    target the ptxas in use assembles (PTXAS_FALLBACK_TARGETS without a ptxas). Modelled targets a
    newer ptxas dropped (sm_50 ... sm_72 with ptxas 13) stay: their PTX still builds, and their
    bank plans still mean something; ptxas says itself that it cannot assemble them."""
    listed = ptxas_targets()
    names = set(MODELLED_TARGETS)
    for t in PTXAS_FALLBACK_TARGETS if listed is None else listed:
        try:
            target_number(t)
        except ValueError:
            continue
        names.add(t)
    return tuple(sorted(names, key=_target_order))


class _SupportedTargets(Sequence):
    """SUPPORTED_TARGETS: supported_targets(), asked when first looked at (not at import: asking
    means running ptxas) and again when the ptxas in use changes (the query is cached per ptxas)."""

    def _all(self) -> tuple[str, ...]:
        return supported_targets()

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __contains__(self, name) -> bool:
        return name in self._all()

    def __eq__(self, other) -> bool:
        return isinstance(other, (tuple, list, Sequence)) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"SUPPORTED_TARGETS{self._all()!r}"


SUPPORTED_TARGETS: Sequence[str] = _SupportedTargets()


def require_supported_target(target: str) -> None:
    """AsmError, listing the accepted targets, unless a build may use `target`."""
    if target not in SUPPORTED_TARGETS:
        raise AsmError(f"unsupported target '{target}' (supported: {', '.join(SUPPORTED_TARGETS)})")
