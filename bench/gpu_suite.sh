#!/usr/bin/env bash
# ONE GPU benchmark run on one H200; each part has a hard time limit (they add up to 1150 s, 1240 s with LOADER=1):
#   1. ViT-B/L bf16 16x224 train-step clips/s and MFU, flash-attn vs SDPA            (bench/memory.py throughput)
#   2. largest micro-batch per size under a 24 GiB cap, planner vs measured, and the
#      planner's allocated-peak error on every probe (target within +-10%)            (bench/memory.py capacity)
#   3. ViT-g training with ZeRO-3 param+optimizer offload + checkpointing under 24 GiB (bench/memory.py giant)
#   4. ViT-B 16x224 bf16 activation bytes with vs without checkpointing on the GPU     (bench/memory.py ratio)
#   5. layer-streaming inference: ViT-L eval clips/s + peak vs stage3_max_live_parameters  (bench/memory.py offload)
#   6. ours vs HF transformers VideoMAE (only when transformers is installed)         (bench/peer.py)
#   7. ZeRO-3 offload inference: peak parameters resident on the GPU during forward for three
#      stage3_max_live_parameters values, ViT-L 16x224 (model built partitioned)       (bench/memory.py resident)
#   8. ViT-B/16 video-text dual encoder, 4 frames, bf16, AVION's 256 clips/GPU with checkpointing:
#      clips/s and peak memory, flash-attn vs SDPA                                     (bench/dual_encoder.py)
#  10. checkpoint policies off / full / selective and compiled blocks, flash-attn, bf16: ours vs HF VideoMAE
#      fine-tune and pretrain, ours alone (ViT-B 16x224), and ours vs AVION's model code when
#      AVION_SRC=DIR (a clone of github.com/zhaoyue-zephyrus/AVION) is set      (bench/checkpoint_pairs.py)
#  11. UMT distillation step vs VideoMAE pretraining vs fine-tuning at ViT-B, bf16, with each variant's peak
#      memory and the planner's teacher-forward estimate against the measured one           (bench/umt_step.py)
#  12. token merging (ToMe) at ViT-B/L 16x224 bf16: eval clips/s and train step, merged vs not (bench/token_merge.py)
#  13. run-length tokenization on the GPU: the packed-clip tests (nested SDPA, flash varlen where installed)
#      against the CPU reference, then ViT-B/L 16x224 bf16 eval / train step at 26.8 % of the tokens dropped
#      (the real-footage fraction at threshold 0.1) vs the full model      (tests/models/test_rlt_cuda.py, bench/rlt.py)
#   9. (LOADER=1 only, ~90 s) decode paths incl. torchcodec-cuda (NVDEC + GPU crop) vs the AVION-style
#      reference, one process, one decoder thread                                        (bench/loader.py)
# then bench/report.py merges the JSON files into suite.json and draws suite.png.
#
# usage: bash bench/gpu_suite.sh [OUT_DIR]      (default: bench_out/gpu_suite_<timestamp>)
# env:   PARTS=throughput,capacity,...  (only these parts; default: all)  LIMIT_CAPACITY=190 (a part's limit, s)
#        CAP=24GiB  SKIP_PEER=1  TORCH_EXTENSIONS_DIR (DeepSpeed op cache; CPU Adam builds on first use)
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-bench_out/gpu_suite_$(date +%Y%m%d_%H%M%S)}
CAP=${CAP:-24GiB}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/avion_torch_ext}
export PYTHONUNBUFFERED=1

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu_suite.sh: needs a CUDA GPU (torch.cuda.is_available() is False)" >&2
    exit 2
fi
python - <<'PY' | tee "$OUT/environment.txt"
import torch, deepspeed
print("gpu:", torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
print("torch:", torch.__version__, "cuda:", torch.version.cuda, "deepspeed:", deepspeed.__version__)
try:
    import flash_attn
    print("flash-attn:", flash_attn.__version__)
except Exception as e:
    print("flash-attn: not available:", type(e).__name__)
PY

START=$(date +%s)
FAILED=()
# run NAME LIMIT_S CMD... : hard time limit per part (LIMIT_<NAME> overrides it); the suite goes on when a
# part fails; a part not named in PARTS (when set) is skipped
run() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${PARTS:-}" ] && [[ ",$PARTS," != *",$name,"* ]]; then
        echo "== $name: skipped (not in PARTS)"
        return 0
    fi
    local override="LIMIT_${name^^}"
    limit=${!override:-$limit}
    echo "== $name (limit ${limit}s, elapsed $(( $(date +%s) - START ))s)"
    timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "== $name: exit code $rc" | tee -a "$OUT/$name.log"
        FAILED+=("$name:$rc")
    fi
}

run throughput 100 python bench/memory.py --device cuda --parts throughput --json "$OUT/throughput.json"
run capacity 190 python bench/memory.py --device cuda --parts capacity --cap "$CAP" --json "$OUT/capacity.json"
run giant 120 python bench/memory.py --device cuda --parts giant --cap "$CAP" --json "$OUT/giant.json"
run ratio 35 python bench/memory.py --device cuda --parts ratio --dtype bf16 --json "$OUT/ratio.json"
run offload 60 python bench/memory.py --device cuda --parts offload --dtype bf16 --offload-model vit_large_patch16_224 \
    --offload-batch 8 --offload-iters 3 --json "$OUT/offload.json"
if [ -z "${SKIP_PEER:-}" ] && python -c "import transformers" 2>/dev/null; then
    run peer 55 python bench/peer.py --device cuda --dtype bf16 --batch 8 --steps 8 --json "$OUT/peer.json"
else
    echo "== peer: skipped (transformers not installed or SKIP_PEER set)"
fi
run resident 60 python bench/memory.py --device cuda --parts resident --offload-model vit_large_patch16_224 \
    --frames 16 --size 224 --offload-live 10000000,50000000,200000000 --json "$OUT/resident.json"
run clip 80 python bench/dual_encoder.py --device cuda --dtype bf16 --batch 256 --backends flash sdpa --ckpt-only \
    --warmup 1 --iters 3
PAIRS=finetune,pretrain,self
[ -n "${AVION_SRC:-}" ] && PAIRS=avion,$PAIRS
# flash-attn where it imports, else SDPA (ATTN= sets it)
ATTN=${ATTN:-$(python -c "import flash_attn" 2>/dev/null && echo flash || echo sdpa)}
run policies 150 python bench/checkpoint_pairs.py --device cuda --dtype bf16 --attn "$ATTN" --pairs "$PAIRS" \
    --batch 8 --compile --warmup 2 --repeats 3 ${AVION_SRC:+--avion-src "$AVION_SRC"}
run umt 90 python bench/umt_step.py --device cuda --dtype bf16 --batch 16 --warmup 2 --iters 3
run tome 90 python bench/token_merge.py --device cuda --dtype bf16 --batch 8 --frames 16 \
    --models vit_base_patch16_224 vit_large_patch16_224 --warmup 2 --iters 5
run rlt 120 bash -c "python -m pytest -q -p no:cacheprovider tests/models/test_rlt_cuda.py && \
    python bench/rlt.py --device cuda --dtype bf16 --batch 16 --fraction 0.268 --skip-fractions \
    --models vit_base_patch16_224 vit_large_patch16_224 --warmup 2 --iters 5"
if [ -n "${LOADER:-}" ]; then
    run loader 90 python bench/loader.py --seconds 20 --fps 30 --clips 10 --repeats 2 --parts paths \
        --workdir "$OUT/loader_work"
fi

shopt -s nullglob
JSONS=("$OUT"/throughput.json "$OUT"/capacity.json "$OUT"/giant.json "$OUT"/ratio.json "$OUT"/offload.json
       "$OUT"/peer.json)
EXIST=()
for f in "${JSONS[@]}"; do [ -f "$f" ] && EXIST+=("$f"); done
if [ ${#EXIST[@]} -gt 0 ]; then
    python bench/report.py "${EXIST[@]}" --out "$OUT/suite.png" --merged "$OUT/suite.json"
else
    echo "bench/gpu_suite.sh: no part produced results" >&2
fi
echo "== done in $(( $(date +%s) - START ))s; results in $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "== failed parts: ${FAILED[*]}" >&2
    exit 1
fi
