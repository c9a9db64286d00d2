# Sourced by the one-GPU A/B scripts (gpu_fp8fuse_ab.sh, gpu_moe_small_ab.sh, gpu_pdl_ab.sh,
# gpu_pdl2_ab.sh): `budget_step NAME NEED COMMAND...` runs COMMAND, this tree first on
# PYTHONPATH, into $STEP_DIR/NAME.log (STEP_DIR: $OUT unless set), skipped where its usual NEED
# seconds would pass the caller's $budget, and stopped after twice NEED (a hung step leaves
# time to the others). It writes NAME.rc, adds a line to $STEP_DIR/steps, prints "[NAME: rc=R
# T s] <the log's last line>", and where the command failed prints pytest's FAILED lines and
# the log's end and adds them to $FAILURES_LOG ($STEP_DIR/failures.log unless set).
# NEED_SCALE (1 unless set) multiplies every NEED: a cold machine compiles what a warm one has.
budget_step() {
  local name=$1 need=$(($2 * ${NEED_SCALE:-1})); shift 2
  local dir=${STEP_DIR:-$OUT}
  if [ $((SECONDS + need)) -gt "$budget" ]; then
    echo "[$name skipped: $SECONDS s used]"; echo "$name skipped at $SECONDS s" >> "$dir/steps"
    return 0
  fi
  local start=$SECONDS limit=$((budget - SECONDS))
  [ $limit -gt $((2 * need)) ] && limit=$((2 * need))
  PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" timeout $limit "$@" > "$dir/$name.log" 2>&1
  local rc=$? last
  last=$(tail -1 "$dir/$name.log" | cut -c1-200)
  echo "$rc" > "$dir/$name.rc"
  echo "$name rc=$rc $((SECONDS - start)) s$(grep -qE "passed|failed|error" <<< "$last" && echo " | $last")" \
    >> "$dir/steps"
  echo "[$name: rc=$rc $((SECONDS - start)) s] $last"
  if [ $rc -ne 0 ]; then
    { echo "== $name (rc=$rc)"; grep -E "^(FAILED|ERROR) " "$dir/$name.log" | head -15
      tail -12 "$dir/$name.log"; } | cut -c1-300 | tee -a "${FAILURES_LOG:-$dir/failures.log}" \
      | sed 's/^/    /'
  fi
}
