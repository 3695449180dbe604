#!/usr/bin/env python3
"""Latency and issue-rate microbenchmarks for the scheduler's table (scheduler/latencies_sm90.py).

Each test is a PTX kernel run by ONE warp (one block of 32 threads, so no other warp hides
anything): a loop of UNROLL dependent instructions (each reads the previous one's result) between
two reads of %clock64; cycles / (iterations * UNROLL) is the dependent-issue latency. Memory
latencies chase a pointer that points to itself (the address of the next load is the value of the
previous one). `*_issue` tests run 8 independent chains instead, giving cycles per instruction
when nothing waits: the issue cost of one warp instruction on its pipe. (Issue tests of
independent shared loads were dropped: ptxas restructured their loop and the figure, 0.3
cycles per load, was impossible.)

The PTX is JIT-compiled by the driver (cupy.RawModule(path=...)); `--ptx DIR` writes it out so the
SASS can be checked with ptxas + nvdisasm (that each chain became the SASS opcode named here).

Usage:
    python3 tools/sched_latency_ubench.py --json $OUT/sched_latency.json     # GPU: the table's numbers
    python3 tools/sched_latency_ubench.py --ptx /tmp/ubench_ptx               # no GPU: the PTX only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from asmgemm.errors import AsmError
from asmgemm.files import write_atomic
from asmgemm.runtime.gpu import require_gpu

UNROLL = 128
ITERS = 64
CHAINS = 8

# name -> (register declarations, setup, one chained step with {x} the chained register, SASS,
#          chain register, what the step is)
_REGS = """
    .reg .b32 %r<40>; .reg .f32 %f<40>; .reg .b64 %rd<40>; .reg .f64 %fd<40>; .reg .pred %p<4>;
    .reg .b32 %h<40>;
"""


def _kernel(name: str, setup: str, step: str, finish: str, chains: int = 1) -> str:
    body = []
    for _ in range(UNROLL // chains):
        for c in range(chains):
            body.append("    " + step.format(c=c, c1=c + 10, c2=c + 20, c4=4 * c, c16=16 * c))
    return f"""
.visible .entry {name}(.param .u64 out, .param .u64 buf, .param .u32 iters)
{{
{_REGS}
    .shared .align 16 .b8 sm[1024];
    ld.param.u64 %rd30, [out];
    ld.param.u64 %rd31, [buf];
    ld.param.u32 %r39, [iters];
    cvta.to.global.u64 %rd30, %rd30;
    cvta.to.global.u64 %rd31, %rd31;
    mov.u32 %r38, %tid.x;
    cvt.rn.f32.u32 %f39, %r38;
{setup}
    bar.sync 0;
    mov.u64 %rd32, %clock64;
LOOP:
{chr(10).join(body)}
    sub.u32 %r39, %r39, 1;
    setp.ne.u32 %p3, %r39, 0;
    @%p3 bra LOOP;
    mov.u64 %rd33, %clock64;
{finish}
    sub.u64 %rd34, %rd33, %rd32;
    mul.wide.u32 %rd35, %r38, 16;
    add.u64 %rd36, %rd30, %rd35;
    st.global.u64 [%rd36], %rd34;
    ret;
}}
"""


def _init_chains(kind: str, n: int) -> str:
    lines = []
    for c in range(n):
        if kind == "f":
            lines += [f"    add.f32 %f{c}, %f39, 0f3F800000;", f"    add.f32 %f{c + 10}, %f39, 0f3F000000;",
                      f"    add.f32 %f{c + 20}, %f39, 0f3E800000;"]
        elif kind == "r":
            lines += [f"    add.u32 %r{c}, %r38, {c + 1};", f"    add.u32 %r{c + 10}, %r38, 3;",
                      f"    add.u32 %r{c + 20}, %r38, 5;"]
        elif kind == "d":
            lines += [f"    cvt.f64.f32 %fd{c}, %f39;", f"    cvt.f64.f32 %fd{c + 10}, %f39;",
                      f"    cvt.f64.f32 %fd{c + 20}, %f39;"]
        elif kind == "h":
            lines += [
                f"    cvt.rn.f16x2.f32 %h{c}, %f39, %f39;", f"    cvt.rn.f16x2.f32 %h{c + 10}, %f39, %f39;",
                f"    cvt.rn.f16x2.f32 %h{c + 20}, %f39, %f39;"]
    return "\n".join(lines)


def _sink(kind: str, n: int) -> str:
    regs = {"f": "%f", "r": "%r", "d": "%fd", "h": "%h"}[kind]
    st = {"f": "st.global.f32", "r": "st.global.u32", "d": "st.global.f64", "h": "st.global.b32"}[kind]
    return "\n".join(f"    {st} [%rd31+{8 * c}], {regs}{c};" for c in range(n))


def tests() -> dict[str, dict]:
    t: dict[str, dict] = {}

    def alu(name, kind, step, sass, chains=1):
        t[name] = {"ptx": _kernel(name, _init_chains(kind, chains), step, _sink(kind, chains), chains),
                   "sass": sass, "per": UNROLL}

    alu("ffma", "f", "fma.rn.f32 %f{c}, %f{c}, %f{c1}, %f{c2};", "FFMA")
    alu("ffma_issue", "f", "fma.rn.f32 %f{c}, %f{c}, %f{c1}, %f{c2};", "FFMA", CHAINS)
    alu("fadd", "f", "add.f32 %f{c}, %f{c}, %f{c1};", "FADD")
    alu("fmul", "f", "mul.f32 %f{c}, %f{c}, %f{c1};", "FMUL")
    alu("hfma2", "h", "fma.rn.f16x2 %h{c}, %h{c}, %h{c1}, %h{c2};", "HFMA2")
    alu("dfma", "d", "fma.rn.f64 %fd{c}, %fd{c}, %fd{c1}, %fd{c2};", "DFMA")
    alu("dfma_issue", "d", "fma.rn.f64 %fd{c}, %fd{c}, %fd{c1}, %fd{c2};", "DFMA", CHAINS)
    alu("imad", "r", "mad.lo.u32 %r{c}, %r{c}, %r{c1}, %r{c2};", "IMAD")
    alu("imad_issue", "r", "mad.lo.u32 %r{c}, %r{c}, %r{c1}, %r{c2};", "IMAD", CHAINS)
    alu("shf", "r", "shf.l.wrap.b32 %r{c}, %r{c}, %r{c}, %r{c1};", "SHF")
    alu("iadd3_lop3", "r", "add.u32 %r{c}, %r{c}, %r{c1};\n    xor.b32 %r{c}, %r{c}, %r{c2};", "IADD3+LOP3")
    alu("mufu_ex2", "f", "ex2.approx.ftz.f32 %f{c}, %f{c};", "MUFU.EX2")
    alu("mufu_issue", "f", "ex2.approx.ftz.f32 %f{c}, %f{c};", "MUFU.EX2", CHAINS)
    # Round trips that ptxas could fold are broken by an FMUL (subtract its latency).
    alu("i2f_fmul_f2i", "r", "cvt.rn.f32.s32 %f{c}, %r{c};\n    mul.f32 %f{c}, %f{c}, %f39;\n"
        "    cvt.rzi.s32.f32 %r{c}, %f{c};", "I2F+FMUL+F2I")
    alu("shfl", "r", "shfl.sync.idx.b32 %r{c}, %r{c}, %r{c}, 31, -1;", "SHFL.IDX")
    alu("popc", "r", "popc.b32 %r{c}, %r{c};", "POPC")
    alu("isetp_sel", "r", "setp.lt.u32 %p{c}, %r{c}, %r{c1};\n    selp.b32 %r{c}, %r{c2}, %r{c1}, %p{c};",
        "ISETP+SEL")

    # Shared memory: sm[a] = a, chase from a = 0 (the loaded value is the next address).
    sm_setup = """    mov.u32 %r0, 0;
    shl.b32 %r1, %r38, 4;
    st.shared.v4.u32 [%r1], {%r1, %r1, %r1, %r1};
    st.shared.v4.u32 [%r1+512], {%r1, %r1, %r1, %r1};
    mov.u32 %r0, 0;"""
    sm_sink = "    st.global.u32 [%rd31], %r0;"
    # volatile: otherwise ptxas narrows a vector load whose other elements are unused.
    for name, step, sass in (("lds32", "ld.volatile.shared.u32 %r0, [%r0];", "LDS"),
                             ("lds64", "ld.volatile.shared.v2.u32 {{%r0, %r2}}, [%r0];", "LDS.64"),
                             ("lds128", "ld.volatile.shared.v4.u32 {{%r0, %r2, %r3, %r4}}, [%r0];", "LDS.128")):
        t[name] = {"ptx": _kernel(name, sm_setup, step, sm_sink), "sass": sass, "per": UNROLL}
    # Global memory: buf[0] holds its own address; .ca hits L1 after the first trip, .cg goes to L2.
    g_setup = """    st.global.u64 [%rd31], %rd31;
    membar.gl;
    mov.u64 %rd0, %rd31;"""
    g_sink = "    st.global.u64 [%rd31+64], %rd0;"
    for name, step, sass in (("ldg", "ld.global.u64 %rd0, [%rd0];", "LDG.E.64"),
                             ("ldg_l1", "ld.global.ca.u64 %rd0, [%rd0];", "LDG.E.64.STRONG.SM"),
                             ("ldg_l2", "ld.global.cg.u64 %rd0, [%rd0];", "LDG.E.64.STRONG.GPU")):
        t[name] = {"ptx": _kernel(name, g_setup, step, g_sink), "sass": sass, "per": UNROLL}
    # Tensor core: mma.sync m16n8k16 f16 -> f32, accumulator chained.
    mma_setup = "\n".join([f"    cvt.rn.f16x2.f32 %h{i}, %f39, %f39;" for i in range(6)] +
                          [f"    mov.f32 %f{i}, %f39;" for i in range(4)])
    t["hmma_16816"] = {"ptx": _kernel("hmma_16816", mma_setup,
                                      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%f0, %f1, %f2, %f3}}, "
                                      "{{%h0, %h1, %h2, %h3}}, {{%h4, %h5}}, {{%f0, %f1, %f2, %f3}};",
                                      _sink("f", 4)), "sass": "HMMA.16816.F32", "per": UNROLL}
    return t


def _ptx_file(ptx: str) -> str:
    return ".version 8.0\n.target sm_90\n.address_size 64\n" + ptx


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here (as tools/data/sched_latency_h100.json)")
    ap.add_argument("--ptx", help="write each test's PTX into this folder and exit (no GPU needed)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per test; the median is reported (default 5)")
    args = ap.parse_args(argv)
    all_tests = tests()
    if args.ptx:
        os.makedirs(args.ptx, exist_ok=True)
        for name, t in all_tests.items():
            write_atomic(os.path.join(args.ptx, f"{name}.ptx"), _ptx_file(t["ptx"]))
        print(f"wrote {len(all_tests)} PTX files to {args.ptx}")
        return 0
    try:
        cp = require_gpu("sched_latency_ubench.py")
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"device: {device}, sm_{props['major']}{props['minor']}, clock {props['clockRate'] / 1e3:.0f} MHz")
    results = {}
    out = cp.zeros(64, dtype=cp.uint64)
    buf = cp.zeros(4096, dtype=cp.uint64)
    with tempfile.TemporaryDirectory() as tmp:
        for name, t in all_tests.items():
            path = os.path.join(tmp, f"{name}.ptx")
            with open(path, "w") as fh:
                fh.write(_ptx_file(t["ptx"]))
            try:
                fn = cp.RawModule(path=path).get_function(name)
                samples = []
                for _ in range(args.repeat + 1):          # the first run warms caches and the JIT
                    fn((1,), (32,), (out, buf, cp.uint32(ITERS)))
                    cp.cuda.runtime.deviceSynchronize()
                    samples.append(int(out[0].get()) / (ITERS * t["per"]))
                value = statistics.median(samples[1:])
                results[name] = {"cycles": round(value, 2), "sass": t["sass"], "samples": [round(s, 2) for s in samples[1:]]}
                print(f"{name:14s} {value:8.2f} cycles/instr   ({t['sass']})", flush=True)
            except Exception as exc:          # report and go on: one bad test must not lose the rest
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:14s} ERROR {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    if args.json:
        write_atomic(args.json, json.dumps({"device": device, "unroll": UNROLL, "iters": ITERS,
                                            "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
