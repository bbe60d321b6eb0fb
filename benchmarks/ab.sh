#!/usr/bin/env bash
# Side-by-side runs of several versions of ubep in one call on a GPU machine: each version a copy of
# the package in .ab/NAME (git archive of a commit, made where the repository is), each run from its
# own directory so that it imports its own copy, versions alternating ROUNDS times (default 2).
#   benchmarks/ab.sh prepare NAME=REF[+PATCH...] ...   here: .ab/NAME from commit REF, with each
#                                     PATCH (a file of `git diff` output) applied (replaces .ab)
#   benchmarks/ab.sh profile [ubep profile options]    every copy, alternating (on a GPU machine
#                                                      with --pg nccl --backend cuda)
#   benchmarks/ab.sh bench [bench_ep.py options]       the same with benchmarks/bench_ep.py
#   benchmarks/ab.sh pytest NAME [pytest options]      one copy's tests
# profile / bench / pytest write their logs under $OUT (default ab-out), one per run with the run's
# CSV / PNG files beside it, print the lines of interest, and pack it all into
# $OUT/ab-<subcommand>-N.tgz at the end, N counting that subcommand's calls (machines that return
# few files take them). Each profile / bench run stops after RUN_LIMIT_S seconds (default 300): set
# it so that every copy gets its share of a call's time (a command cut by an outer timeout packs
# nothing, and the copies after the slow one do not run). .ab is ignored by git: name it in the
# device call's carry. Prepare the base version twice, first and last (a_main=HEAD b_x=HEAD+x.patch
# c_main=HEAD): the position of a copy in the order alone can move its figures by tenths of a µs
# (H200, docs/BENCHMARKS.md); the two identical copies show the spread a change must beat.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ubep-triton-cache}
out=$(realpath -m "${OUT:-ab-out}")
rounds=${ROUNDS:-2}
run_limit=${RUN_LIMIT_S:-300}

pack() {  # pack TAG: this subcommand's logs into $OUT/ab-TAG-N.tgz, N counting its calls
  local n=1
  while [ -e "$out/ab-$1-$n.tgz" ]; do n=$((n + 1)); done
  tar -czf "$out/ab-$1-$n.tgz" -C "$out" logs && rm -rf "$out/logs"
}

each_copy() {  # each_copy TAG COMMAND...: COMMAND in every copy's directory, alternating rounds
  local tag=$1
  shift
  mkdir -p "$out/logs"
  for round in $(seq "$rounds"); do
    for dir in .ab/*/; do
      local name log
      name=$(basename "$dir")
      log="$out/logs/$tag-$name-$round.log"
      rm -rf /tmp/ab-run
      (cd "$dir" && python3 -c "import ubep; print('ubep from', ubep.__file__)" && "$@") >"$log" 2>&1
      echo "== $tag $name round $round: exit $?"
      [ -d /tmp/ab-run ] && mv /tmp/ab-run "${log%.log}"  # the run's CSV / PNG files
      grep -E "kernel|done at|cuda/.*(dispatch|combine)" "$log" | head -n 40
    done
  done
  pack "$tag"
}

case ${1:-} in
  prepare)
    shift
    rm -rf .ab
    for spec in "$@"; do
      name=${spec%%=*}
      source=${spec#*=}
      ref=${source%%+*}
      mkdir -p ".ab/$name" && git archive "$ref" | tar -x -C ".ab/$name" || exit 1
      patches=${source#"$ref"}
      for patch in ${patches//+/ }; do
        git apply --directory=".ab/$name" "$patch" || exit 1
      done
    done ;;
  profile)
    shift
    each_copy profile timeout "$run_limit" python3 -m ubep.cli profile --out /tmp/ab-run "$@" ;;
  bench)
    shift
    each_copy bench env PYTHONPATH=. timeout "$run_limit" python3 benchmarks/bench_ep.py \
      --out /tmp/ab-run "$@" ;;
  pytest)
    name=$2
    shift 2
    mkdir -p "$out/logs"
    (cd ".ab/$name" && timeout 580 python3 -m pytest -q -rf "$@") >"$out/logs/pytest-$name.log" 2>&1
    echo "== pytest $name: exit $?"
    tail -n 5 "$out/logs/pytest-$name.log"
    pack "pytest-$name" ;;
  *)
    echo "usage: benchmarks/ab.sh prepare NAME=REF[+PATCH...] ... | profile ARGS | bench ARGS | pytest NAME ARGS" >&2
    exit 2 ;;
esac
