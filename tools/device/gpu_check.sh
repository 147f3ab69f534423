#!/usr/bin/env bash
# Every GPU check the open issues need, in one run on a lent device (one H200; 10 minutes per command, 15 a session).
#
#   here, once:  bash tools/device/gpu_wheels.sh                  # the wheels the device image lacks, into .whl/
#   device:      run  command "bash tools/device/gpu_check.sh"  carry [".whl"]  timeout_s 600
#
# Installs nothing from the network (the carried wheels go to /tmp/site, the package is used from src/). Each part has
# its own time limit, and one that fails or times out does not stop the others; the logs and the JSON rows go to $OUT,
# the summary tables come last. Parts (issue 15, kernels and throughput):
#   environment  GPU, versions, which kernels import
#   gpu_tests    the `gpu`-marked tests: Liger RMSNorm/SwiGLU/rotary against PyTorch, Liger RMSNorm in the flow
#                transformers, the compiled fused linear GRPO loss, inverse-transform sampling on CUDA
#   vlm_3b       benchmarks/gpu_vlm_grpo.py: the Qwen2.5-VL-3B-shaped policy, 4 x 8 completions of 256 tokens,
#                sdpa / sdpa+Liger / flash_attention_2+Liger x LoRA / full x shared prefix on / off; rollout and training
#                tokens/s, training MFU, peak memory; then SD3.5-medium and Wan2.1-1.3B fwd+bwd per attention backend
#   fsdp_1gpu    issues 32/33: the CLI's FSDP2Strategy on one GPU (NCCL) with bf16-mixed over float32 weights, 2 steps
#                with a checkpoint each step, then a resume to step 3; the precision line every fit prints is kept
#                (ACCEL=cpu runs the same part on CPU, which is how it was tested:
#                PARTS=fsdp_1gpu ACCEL=cpu PY=.venv/bin/python bash tools/device/gpu_check.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="${PY:-python3}"
SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 || { echo "installing the carried wheels failed:"; tail -5 "$OUT/wheels.log"; exit 1; }
fi
export PYTHONPATH="$SITE:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"

outcomes=()
part() {  # part NAME SECONDS COMMAND...: run it under a time limit into $OUT/NAME.log and record how it ended
  local name=$1 limit=$2 started=$SECONDS rc
  shift 2
  if [[ -n "${PARTS:-}" && " $PARTS " != *" $name "* ]]; then return; fi  # PARTS="a b": only those parts
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  case $rc in 0) how=ok ;; 124) how="timed out" ;; *) how="failed (exit $rc)" ;; esac
  outcomes+=("| $name | $how | $((SECONDS - started)) s |")
}

part environment 60 "$PY" - <<'PY'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no CUDA device)")
for name in ("transformers", "diffusers", "peft", "lightning", "liger_kernel", "flash_attn", "triton"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as error:  # noqa: BLE001
        print(name, "not importable:", type(error).__name__, error)
import app.models, app.modules  # the package imports against these versions
print("app imports")
PY
part gpu_tests 150 "$PY" -m pytest -m gpu -p no:cacheprovider -o addopts="-ra -q" \
  tests/models/test_kernels.py tests/algorithms/test_fused_linear.py tests/sampling/test_token_sampling.py \
  tests/models/test_packing.py
part vlm_3b 300 "$PY" benchmarks/gpu_vlm_grpo.py --variants sdpa sdpa+liger flash_attention_2+liger \
  --modes lora full --shared on off --new-tokens 256 --out "$OUT/vlm_3b.jsonl"
fsdp_args=(--config configs/quickstart/trisr_dots.yaml --validate_before_and_after false --trainer.accelerator "${ACCEL:-gpu}"
  --trainer.devices 1 --trainer.strategy.class_path app.parallel.FSDP2Strategy --trainer.precision bf16-mixed
  --trainer.limit_val_batches 0 --trainer.default_root_dir "$OUT/fsdp_run" --trainer.logger false
  --trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint --trainer.callbacks.dirpath="$OUT/fsdp_run/ckpt"
  --trainer.callbacks.every_n_train_steps=1 --trainer.callbacks.save_last=true)
part fsdp_1gpu 240 bash -c '"$0" -m app fit "$@" --trainer.max_steps 2 && "$0" -m app fit "$@" --trainer.max_steps 3 \
  --ckpt_path "'"$OUT"'/fsdp_run/ckpt/last.ckpt"' "$PY" "${fsdp_args[@]}"

show() { [[ -f "$OUT/$1.log" ]] && { echo; "${@:2}" "$OUT/$1.log"; }; }  # show PART COMMAND...: on its log
show environment cat
show gpu_tests tail -n 15
show vlm_3b grep '^|' || show vlm_3b tail -n 20
show fsdp_1gpu grep -E "^precision:|Restored all states|stopped:" || show fsdp_1gpu tail -n 10
echo
echo "| part | outcome | time |"
echo "|---|---|---|"
printf '%s\n' "${outcomes[@]}"
