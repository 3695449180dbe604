# Shared set-up of every device script: `source tools/device_setup.sh || exit 1` from the
# repository root on the GPU machine (a copy of the working tree, no package registry there).
#
#  1. installs the carried wheels (.whl/*.whl, made by ../shared/gpu/fetch-wheels.sh: lark, the
#     one dependency that machine lacks) into /tmp/site;
#  2. lays out a copy of the package as the installed one would be, .gpu_pkg/asmgemm/..., from
#     pyproject.toml's [tool.setuptools] package-dir (asmgemm = asm/, its subpackages such as
#     runtime/, bench/ and tuning/ come with it; asmgemm.grammar, .kernels_ptx and .scheduler from
#     their own top-level folders), instead of an install (no build, no symlinks);
#  3. exports PYTHONPATH=/tmp/site:.gpu_pkg, ASMGEMM_CACHE_DIR (default /tmp/asmgemm-cache),
#     PYTHONUNBUFFERED=1, and /usr/local/cuda/bin on PATH (compute-sanitizer, ncu);
#  4. prints the versions (python, asmgemm, cupy, ptxas) and nvidia-smi's view of the GPU, also
#     into $OUT/gpu.txt when $OUT is set.
# Returns non-zero (without exiting the caller's shell) when asmgemm or CuPy do not import.

if [[ ! -f pyproject.toml || ! -d asm ]]; then
    echo "device_setup: run from the repository root (no pyproject.toml/asm here: $PWD)" >&2
    return 2 2>/dev/null || exit 2
fi

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 \
        || echo "device_setup: warning: pip could not install .whl/*.whl into /tmp/site" >&2
else
    echo "device_setup: warning: no .whl/*.whl (carry [\".whl\"], made by ../shared/gpu/fetch-wheels.sh)" >&2
fi

# The package layout, read from pyproject.toml so that a new mapping there needs no edit here.
rm -rf .gpu_pkg
python3 - <<'EOF' || { echo "device_setup: could not lay out .gpu_pkg" >&2; return 1 2>/dev/null || exit 1; }
import re, shutil
from pathlib import Path
text = Path("pyproject.toml").read_text()
try:
    import tomllib
    dirs = tomllib.loads(text)["tool"]["setuptools"]["package-dir"]
except ImportError:  # Python 3.10: the one-line inline table pyproject.toml uses
    line = re.search(r"^package-dir\s*=\s*\{(.*)\}", text, re.M).group(1)
    dirs = dict(re.findall(r'"([\w.]+)"\s*=\s*"([^"]+)"', line))
for name in sorted(dirs, key=lambda n: n.count(".")):        # asmgemm first, then its children
    shutil.copytree(dirs[name], Path(".gpu_pkg", *name.split(".")), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
print("device_setup: .gpu_pkg:", ", ".join(f"{n} <- {d}/" for n, d in sorted(dirs.items())))
EOF

export PYTHONPATH=/tmp/site:$PWD/.gpu_pkg${PYTHONPATH:+:$PYTHONPATH}
export ASMGEMM_CACHE_DIR=${ASMGEMM_CACHE_DIR:-/tmp/asmgemm-cache}
export PYTHONUNBUFFERED=1
[[ -d /usr/local/cuda/bin ]] && export PATH=$PATH:/usr/local/cuda/bin

python3 - <<'EOF' || { echo "device_setup: asmgemm or CuPy does not import" >&2; return 1 2>/dev/null || exit 1; }
import sys
import asmgemm, cupy
from asmgemm.toolchain import find_tool, tool_version
from asmgemm.runtime.gpu import device_facts
f = device_facts()
print(f"python {sys.version.split()[0]}; asmgemm {asmgemm.__version__} from {asmgemm.__file__}; cupy {cupy.__version__}")
print(f"ptxas {find_tool('ptxas')} ({tool_version('ptxas')}); GPU {f.name}, {f.target}, {f.sm_count} SMs")
EOF
if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
else
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
fi
true
