#!/usr/bin/env bash
# Regenerate the PTX corpus (tests/corpus/ptx/*.ptx) from the CUDA sources in tests/corpus/cuda/.
#
# Each .cu names its outputs and nvcc flags in lines of the form
#     // corpus-ptx: OUTPUT_NAME FLAG...
# e.g. `// corpus-ptx: debug_G -arch=sm_90 -G` writes tests/corpus/ptx/debug_G.ptx with
# `nvcc -ptx -arch=sm_90 -G`. The generated PTX is committed, so CI needs ptxas but not nvcc.
# Files not produced from a .cu (such as triton_*.ptx captured from Triton) are left alone.
#
# The sources are compiled in a fixed folder (ASMGEMM_CORPUS_BUILD, default
# /tmp/asmgemm-corpus-build) because nvcc writes the absolute source path into `.file` lines and
# -G debug info; a fixed path keeps the output the same whichever checkout regenerates it.
#
# Usage: tools/regen_corpus.sh           regenerate (nvcc from $NVCC or PATH)
#        tools/regen_corpus.sh --check   regenerate into the build folder and diff with the
#                                        committed files; exit 1 if any differ
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src_dir="$repo/tests/corpus/cuda"
out_dir="$repo/tests/corpus/ptx"
build="${ASMGEMM_CORPUS_BUILD:-/tmp/asmgemm-corpus-build}"
nvcc="${NVCC:-nvcc}"
max_bytes=$((300 * 1024))

check=0
case "${1:-}" in
    --check) check=1 ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "regen_corpus: nvcc not found (set NVCC=/path/to/nvcc)" >&2
    exit 2
fi

mkdir -p "$build" "$out_dir"
echo "regen_corpus: $("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"

status=0
shopt -s nullglob
for cu in "$src_dir"/*.cu; do
    base=$(basename "$cu")
    cp "$cu" "$build/$base"
    specs=$(sed -n 's|^// corpus-ptx:[[:space:]]*||p' "$cu")
    if [[ -z "$specs" ]]; then
        echo "regen_corpus: $base has no '// corpus-ptx: NAME FLAGS' line" >&2
        status=1
        continue
    fi
    while read -r name flags; do
        [[ -n "$name" ]] || continue
        # shellcheck disable=SC2086  # flags are words on purpose
        (cd "$build" && "$nvcc" -ptx $flags "$base" -o "$name.ptx")
        size=$(wc -c < "$build/$name.ptx")
        if (( size > max_bytes )); then
            echo "regen_corpus: $name.ptx is $size bytes (limit $max_bytes): make $base smaller" >&2
            status=1
            continue
        fi
        if (( check )); then
            if ! cmp -s "$build/$name.ptx" "$out_dir/$name.ptx"; then
                echo "regen_corpus: $name.ptx differs from the committed copy" >&2
                status=1
            fi
        else
            cp "$build/$name.ptx" "$out_dir/$name.ptx"
            printf '  %-28s %8d bytes  (%s: nvcc -ptx %s)\n' "$name.ptx" "$size" "$base" "$flags"
        fi
    done <<< "$specs"
done
exit $status
