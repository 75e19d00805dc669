# Sourced by the GPU scripts (first_call.sh, vllm_call.sh): a step runs under its own limit, is logged, has
# its exit status and seconds recorded in $OUT/steps.tsv, and re-packs every result so far into
# $OUT/results.tgz, so a step that is cut still leaves the others' results. Needs OUT, WORK and LOG set, and
# PACK_EXCLUDE: tar --exclude patterns for what must not come back (weights, caches).
printf 'step\texit\tseconds\tlimit\n' > "$OUT/steps.tsv"
pack() {  # all results so far, replaced atomically (a cut call leaves the last complete pack)
    local excludes=() pattern
    for pattern in "${PACK_EXCLUDE[@]}"; do excludes+=("--exclude=$pattern"); done
    tar czf "$OUT/results.tgz.part" -C "$WORK" "${excludes[@]}" . 2>/dev/null \
        && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}
step() {  # step NAME SECONDS COMMAND...: run under a limit, log it, record its exit, pack, never stop the script
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
    timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$limit" >> "$OUT/steps.tsv"
    echo "== $name: exit $rc after $(($(date +%s) - start))s" | tee -a "$LOG"
    pack
}
