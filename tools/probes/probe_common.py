"""What the timing probes in this folder (few_rows_probe.py, fp32_pad_probe.py) share: the cuBLAS
references they time beside asmgemm, and the L2 flush and pre-roll of asmgemm bench's `gpu` mode.
Imported by name: a script run as `python3 tools/probes/NAME.py` has this folder on sys.path."""
from __future__ import annotations


def cublas_calls(cp, av, bv, c) -> dict:
    """{"cupy": ..., "torch": ...}: op(A) op(B) into c through cupy.matmul and torch.matmul (torch
    where it is installed), the references a probe times beside asmgemm (the faster of the two is
    the comparison, as in asmgemm bench)."""
    fns = {"cupy": lambda: cp.matmul(av, bv, out=c)}
    try:
        import torch
    except ImportError:
        return fns
    t_a, t_b, t_c = (torch.as_tensor(x, device="cuda") for x in (av, bv, c))
    fns["torch"] = lambda: torch.matmul(t_a, t_b, out=t_c)
    return fns


def gpu_timing():
    """(flush, pre_roll) for asmgemm.bench.timing.time_interleaved: L2 flushed before each call, the
    call's host time hidden behind GPU busy-work."""
    from asmgemm.bench.timing import L2Flusher, make_pre_roll
    return L2Flusher(), make_pre_roll()
