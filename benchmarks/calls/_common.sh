# Sourced by the device calls (run from the repo root, .whl carried): installs the 9 wheels the
# GPU image lacks and defines `step NAME TIMEOUT COMMAND...`, which runs one measurement with
# --work and --out of its own, prints its result line and errors, and cleans up after it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() {
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -k 5 "$limit" "$@" --work /tmp/w-$name --out $OUT/$name > $OUT/$name.log 2>&1
  echo "== $name rc=$? $((SECONDS-t0))s"; grep -E '"total_seq_len"|"ranks"' $OUT/$name.log | cut -c1-900
  grep -nE "Error|error:" $OUT/$name.log | tail -4 | cut -c1-900
  # a run cut short keeps its steps (times, losses): rank 0's train_metrics.jsonl
  for m in /tmp/w-$name/*/train_metrics.jsonl; do [ -f "$m" ] && cp "$m" $OUT/$name-$(basename $(dirname $m)).jsonl; done
  pkill -f torch.distributed.run; cp /tmp/w-$name/*/torchrun-*.log $OUT/ 2>/dev/null; rm -rf /tmp/w-$name
}
