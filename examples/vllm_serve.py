# vLLM's CPU build serving a local Qwen3-Next / Qwen3.5 model, its GDN layers on gdn.
import sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM starts its engine in a new process
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=1024, skip_tokenizer_init=True,
              enforce_eager=True)  # starts in seconds; without it, vLLM compiles the model
    # with a tokenizer in the directory (no skip_tokenizer_init), prompts can be text
    out = llm.generate([{"prompt_token_ids": [11, 42, 7, 99, 3]}], SamplingParams(max_tokens=8))
    print("generated", list(out[0].outputs[0].token_ids))
