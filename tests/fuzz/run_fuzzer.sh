#!/usr/bin/env bash
# Builds the EROFS reader fuzz target with clang (libFuzzer, ASan, UBSan) in
# WORKDIR/build, replays every crash ever found (tests/fuzz/regressions/)
# through it, then fuzzes for STRATA_FUZZ_SECONDS (default 60) from a seed
# corpus: the committed seeds plus small images mkfs.erofs builds now.
#   tests/fuzz/run_fuzzer.sh SOURCE_DIR WORKDIR
# Exits 77 (CTest: skipped) when clang or its libFuzzer runtime is missing.
# STRATA_BUILD_LOCK=<file> makes the build wait for flock on that file.
set -euo pipefail
src=$(cd "${1:?usage: run_fuzzer.sh SOURCE_DIR WORKDIR}" && pwd)
work=${2:?usage: run_fuzzer.sh SOURCE_DIR WORKDIR}
seconds=${STRATA_FUZZ_SECONDS:-60}
mkdir -p "$work"
work=$(cd "$work" && pwd)

cxx=${STRATA_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
cc=${STRATA_FUZZ_CC:-$(command -v clang || command -v clang-14 || true)}
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "SKIP: clang not found; fuzzing needs clang and libclang-rt-14-dev (scripts/setup installs them)"
  exit 77
fi
probe=$work/probe
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$cxx" -fsanitize=fuzzer,address,undefined -x c++ - -o "$probe" 2>"$probe.log"; then
  echo "SKIP: $cxx cannot link a libFuzzer target (install libclang-rt-14-dev):"
  cat "$probe.log"
  exit 77
fi

lock=()
[ -n "${STRATA_BUILD_LOCK:-}" ] && lock=(flock "$STRATA_BUILD_LOCK")
"${lock[@]}" cmake -S "$src" -B "$work/build" -G Ninja -DSTRATA_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" >/dev/null
"${lock[@]}" cmake --build "$work/build" --target erofs_reader_fuzz -j "${STRATA_FUZZ_JOBS:-2}"
fuzzer=$work/build/tests/fuzz/erofs_reader_fuzz

# Every crash ever found, run once each; any failure fails the test.
shopt -s nullglob
regressions=("$src"/tests/fuzz/regressions/*)
if [ ${#regressions[@]} -gt 0 ]; then
  echo "replaying ${#regressions[@]} regression inputs"
  "$fuzzer" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 "${regressions[@]}" >"$work/replay.log" 2>&1 || {
    cat "$work/replay.log"
    echo "FAIL: a regression input crashes the reader again (see above)"
    exit 1
  }
fi

rm -rf "$work/seeds"
mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"
"$src/tests/fuzz/make_seed_corpus.sh" "$work/seeds"
cp "$src"/tests/fuzz/seeds/* "$work/seeds/" 2>/dev/null || true

echo "fuzzing for ${seconds}s"
if ! "$fuzzer" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "$work/seeds" >"$work/fuzz.log" 2>&1; then
  tail -n 80 "$work/fuzz.log"
  echo "FAIL: the fuzzer found an input that breaks the reader; it is in $work/artifacts/."
  echo "Reproduce with: $fuzzer <input>. Fix the reader, then keep the input forever:"
  echo "  cp <input> $src/tests/fuzz/regressions/<short-description>"
  exit 1
fi
grep -E "stat::number_of_executed_units|stat::peak_rss_mb|cov:" "$work/fuzz.log" | tail -n 4
echo "PASS: no crash in ${seconds}s"
