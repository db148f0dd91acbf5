/* hf.h: Hugging Face Llama and Qwen2 checkpoints <-> ctitan's llama3 and qwen2 parameters, for
 * `ctitan convert` and model.flavor: from_checkpoint of a Hugging Face folder. A run's export and load
 * (checkpoint.last_save_in_hf, initial_load_in_hf) go through the model pack's own table instead
 * (hf_export.h); the packs' tables write the same bytes as hf_save.
 *
 * A Hugging Face folder holds config.json (a LlamaConfig) and model.safetensors (or shards named by
 * model.safetensors.index.json). ctitan names parameters as torchtitan does; the mapping is
 *
 *   tok_embeddings.weight                 model.embed_tokens.weight
 *   layers.N.attention_norm.weight        model.layers.N.input_layernorm.weight
 *   layers.N.attention.wq.weight          model.layers.N.self_attn.q_proj.weight   (rows permuted)
 *   layers.N.attention.wk.weight          model.layers.N.self_attn.k_proj.weight   (rows permuted)
 *   layers.N.attention.wv.weight          model.layers.N.self_attn.v_proj.weight
 *   layers.N.attention.wo.weight          model.layers.N.self_attn.o_proj.weight
 *   layers.N.ffn_norm.weight              model.layers.N.post_attention_layernorm.weight
 *   layers.N.feed_forward.w1.weight       model.layers.N.mlp.gate_proj.weight
 *   layers.N.feed_forward.w2.weight       model.layers.N.mlp.down_proj.weight
 *   layers.N.feed_forward.w3.weight       model.layers.N.mlp.up_proj.weight
 *   norm.weight                           model.norm.weight
 *   output.weight                         lm_head.weight                            (absent when tied)
 *
 * A Qwen2 (model_type "qwen2", Qwen2ForCausalLM) is a Llama with biases on q, k and v:
 *
 *   layers.N.attention.wq.bias            model.layers.N.self_attn.q_proj.bias     (permuted as q's rows)
 *   layers.N.attention.wk.bias            model.layers.N.self_attn.k_proj.bias     (permuted as k's rows)
 *   layers.N.attention.wv.bias            model.layers.N.self_attn.v_proj.bias
 *
 * With tie_word_embeddings (Qwen2-0.5B) its ctitan file has no output.weight: the qwen2 pack
 * shares tok_embeddings.weight with its head.
 *
 * ctitan's RoPE rotates interleaved pairs (x[2i], x[2i+1]) of each head; Hugging Face's rotates
 * halves (x[i], x[i + hd/2]). So q and k rows are permuted per head: HF row h*hd + j*hd/2 + i is
 * ctitan row h*hd + 2i + j (j = 0, 1; i < hd/2), exactly what transformers'
 * convert_llama_weights_to_hf.py `permute` does (with n_kv_heads for k).
 *
 * Weights on the ctitan side are a tf_file (tensorfile.h) of float32 tensors under ctitan's names.
 * Entries that are not parameters (names other than tok_embeddings.weight, norm.weight,
 * output.weight and layers.*) are ignored, so a golden file with config.* / expected.* entries or a
 * model file can be passed as is. Round trips in float32 are bit-exact.
 *
 * Errors: functions return a ct_status and leave one line for ct_last_error() (base/error.h):
 * "DIR/config.json: key 'x': what is wrong".
 */
#ifndef CTITAN_HF_H
#define CTITAN_HF_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "ctitan/model.h" /* CT_MODEL_* feature bits */
#include "formats/hf_export.h"
#include "formats/tensorfile.h"

typedef struct hf_config {
    int64_t dim;        /* hidden_size */
    int64_t n_layers;   /* num_hidden_layers */
    int64_t n_heads;    /* num_attention_heads */
    int64_t n_kv_heads; /* num_key_value_heads */
    int64_t head_dim;   /* dim / n_heads (ctitan derives it; a config.json that says otherwise is refused) */
    int64_t vocab;      /* vocab_size */
    int64_t ffn_hidden; /* intermediate_size */
    int64_t max_position_embeddings;
    double rope_theta, norm_eps; /* rope_theta, rms_norm_eps */
    /* rope_scaling / rope_parameters of rope_type "llama3" (Llama 3.1, 3.2, 3.3): factor,
     * low_freq_factor, high_freq_factor, original_max_position_embeddings. factor 0: plain RoPE
     * (rope_type "default" or none). */
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position;
    int tied;           /* config.json's tie_word_embeddings (lm_head is the embedding table) */
    /* ctitan's side (ct_model_desc.features): CT_MODEL_QKV_BIAS, the blocks hold
     * layers.N.attention.w{q,k,v}.bias (Hugging Face's Qwen2, model_type "qwen2"); and
     * CT_MODEL_TIED_EMBEDDINGS, the pack shares the embedding table with its head, so the ctitan
     * file holds no output.weight. A tied Llama is read for ctitan's untied llama3 pack instead:
     * output.weight a copy of the table. */
    uint32_t features;
} hf_config;

/* Hugging Face's model_type for cfg: "qwen2" with q/k/v biases, else "llama". */
const char *hf_model_type(const hf_config *cfg);


#define HF_DEFAULT_ROPE_THETA 500000.0 /* ctitan's llama3 flavors */
#define HF_DEFAULT_NORM_EPS 1e-5
#define HF_DEFAULT_MAX_POSITIONS 8192

/* Reads DIR/config.json and the weights: *cfg, and *weights (ctitan names, float32, in the order
 * the llama3 pack declares them: tok_embeddings, layers.0 ..., norm, output; free with tf_free).
 * bf16/f16/f32/f64 tensors are converted to float32; q/k rows (and biases) are un-permuted. Reads
 * RoPE of rope_type "default" and "llama3"; refuses configs ctitan cannot run the same way (another
 * RoPE type, a Llama's biases, sliding-window attention, another activation or model type). */
ct_status hf_load(const char *dir, hf_config *cfg, tf_file **weights);

/* Parses config.json's text into *cfg (exposed for the fuzzer and tests). */
ct_status hf_config_parse(const char *json, size_t len, const char *label, hf_config *cfg);

/* Fills dim, vocab, n_layers, ffn_hidden, head_dim (and n_kv_heads when it is 0) from the weights'
 * shapes, and features from which tensors are there (biases; no output.weight: tied). The caller sets n_heads (shapes cannot tell it), rope_theta, norm_eps,
 * max_position_embeddings and the RoPE scaling (or leaves it 0) first. Then checks everything as hf_check_weights does. */
ct_status hf_config_from_weights(hf_config *cfg, const tf_file *weights);

/* Every parameter of cfg's model is present in weights, float32, with its shape, and no
 * parameter-like entry is left over. */
ct_status hf_check_weights(const hf_config *cfg, const tf_file *weights);

/* Writes DIR/config.json and DIR/model.safetensors (tensors in name order, metadata format "pt"),
 * each atomically; creates DIR if it does not exist. The output is a function of the inputs only,
 * byte for byte. */
ct_status hf_save(const char *dir, const hf_config *cfg, const tf_file *weights, hf_dtype dtype);

#endif
