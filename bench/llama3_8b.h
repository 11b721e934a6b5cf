/*  bench/llama3_8b.h — the config.json of Llama-3-8B (Meta-Llama-3.1-8B's shapes and rope),
    for the CUDA benchmarks' dummy models (ls_model_load_dummy).
*/
#ifndef LS_BENCH_LLAMA3_8B_H
#define LS_BENCH_LLAMA3_8B_H

#define LS_BENCH_LLAMA3_8B \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", " \
    "\"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, " \
    "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128, " \
    "\"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-5, " \
    "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, " \
    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, " \
    "\"original_max_position_embeddings\": 8192}, \"tie_word_embeddings\": false, " \
    "\"bos_token_id\": 128000, \"eos_token_id\": 128001, \"torch_dtype\": \"bfloat16\", " \
    "\"hidden_act\": \"silu\"}"

#endif
