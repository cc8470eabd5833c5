#!/usr/bin/env bash
# Compares the render bench of two revisions on a shared, noisy machine: both builds run at
# once, each pinned to a CPU of its own, and swap CPUs every round. Whatever slows the machine
# down (other guests, the host) then slows both alike, which running them one after the other
# does not promise: on the 2-core VM of docs/benchmarks.md the same build's figures varied by a
# third from one run to the next, while the two halves of a pair moved together.
#
# Usage: tests/benches/pinned-pair.sh BEFORE_REV AFTER_REV [ROUNDS] [FILTER]
#   ROUNDS  pairs to run (default 6)
#   FILTER  criterion filter (default: the one-change "nothing" group at 10,000 Ingresses; the
#           bench prints its fastest-of-50 figures for every change and the fastest full render
#           whatever the filter)
# Needs: git, cargo, taskset (util-linux), two CPUs.
set -euo pipefail

before=${1:?usage: $0 BEFORE_REV AFTER_REV [ROUNDS] [FILTER]}
after=${2:?usage: $0 BEFORE_REV AFTER_REV [ROUNDS] [FILTER]}
rounds=${3:-6}
filter=${4:-chart_library_one_change/nothing/10000}
root=$(git rev-parse --show-toplevel)
work="$root/target/pinned-pair"
# Both revisions build into one target directory (dependencies built once); PINNED_PAIR_TARGET
# points it elsewhere (a warm one).
target_dir=${PINNED_PAIR_TARGET:-$work/target}
mkdir -p "$work"

command -v taskset > /dev/null || { echo "taskset (util-linux) is needed to pin each build to a CPU" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "two CPUs are needed, one for each build" >&2; exit 1; }

# Builds the render bench of a revision in a worktree of its own and prints the binary's path.
build() {
    local rev=$1 commit
    commit=$(git -C "$root" rev-parse --verify "$rev^{commit}")
    # The tree stays: the bench reads the chart and the examples from where it was built.
    local tree="$work/tree-$commit" binary="$work/render-$commit"
    if [ ! -x "$binary" ] || [ ! -d "$tree" ]; then
        [ -d "$tree" ] || git -C "$root" worktree add --detach "$tree" "$commit" > /dev/null
        local built
        built=$(cd "$tree" && CARGO_TARGET_DIR="$target_dir" cargo bench --bench render --no-run \
            --message-format=json 2> "$work/build-$commit.log" |
            sed -n '/"kind":\["bench"\]/s/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
        [ -n "$built" ] || { echo "building $rev failed: see $work/build-$commit.log" >&2; exit 1; }
        cp "$built" "$binary"
    fi
    echo "$binary"
}

# The figures one run printed, on one line.
figures() {
    grep -E "10000 Ingresses: (nothing|an Ingress|five).*fastest of 50|chart_library: 10000.*fastest" "$1" |
        sed -E 's/.*10000 Ingresses: //; s/ renders//; s/full render fastest of 10/full render/; s/ \([0-9.]+ µs per Ingress\)//; s/fastest of 50 //' |
        paste -sd '|'
}

before_bin=$(build "$before")
after_bin=$(build "$after")
cd "$root"
for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then cpus=(0 1); else cpus=(1 0); fi
    taskset -c "${cpus[0]}" "$before_bin" --bench "$filter" > "$work/before.log" 2>&1 &
    taskset -c "${cpus[1]}" "$after_bin" --bench "$filter" > "$work/after.log" 2>&1 &
    wait
    for side in before after; do
        grep -q "fastest of 50" "$work/$side.log" || { echo "the $side bench printed no figures:" >&2; tail -n 20 "$work/$side.log" >&2; exit 1; }
    done
    echo "round $round before $before (cpu ${cpus[0]}): $(figures "$work/before.log")"
    echo "round $round after  $after (cpu ${cpus[1]}): $(figures "$work/after.log")"
done
