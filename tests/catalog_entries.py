"""The params= that force one catalog entry (kernels.toml [[NAME.config]]), for GPU tests that run
each configuration at its edge-case shapes whatever the cost model would pick for them."""
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.catalog import entry_candidates


def catalog_entry(name: str, family: str = "hgemm"):
    """The entry `name` of the family's catalog (the like-tables bgemm, hgemm_f32c and bgemm_f32c
    hold hgemm's entries)."""
    return next(e for e in get_spec(family).configs if e.name == name)


def entries_that_split(family: str = "hgemm_mma") -> list:
    """The family's catalog entries that offer a K split (splits past 1; the mma.sync family's
    256-wide tiles run unsplit: kernels.toml)."""
    return [e for e in get_spec(family).configs if max(e.splits) > 1]


def entry_params(name: str, family: str = "hgemm", k: int = 0, splits: int = 1) -> dict:
    """params= that run the catalog entry `name` as the dispatch builds it (C_T=1 for an entry that
    runs as C^T), its K split `splits` ways by the partial pass and the reduce kernel where the entry
    offers that for a K-deep call (1: unsplit, whatever K)."""
    for cand in entry_candidates(catalog_entry(name, family), family, k, plain=True, clusters=False):
        if cand.splits == splits:
            return cand.params()
    raise AssertionError(f"{family}'s {name} offers no {splits}-way split at K = {k}")
