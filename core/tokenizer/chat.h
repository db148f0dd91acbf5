/* chat.h: conversations rendered with a chat template and tokenized, with the tokens that count in
 * the loss (the assistant's), for `ctitan tokenize --format chat`.
 *
 * A conversation is a JSON object, one of
 *   {"messages": [{"role": "...", "content": "..."}, ...]}     (Hugging Face datasets' shape)
 *   {"prompt": "...", "completion": "..."}                      (a user turn and an assistant turn;
 *                                                               either may also be a list of messages)
 * Every message needs a "role" string and a "content" string (null or absent only beside
 * "tool_calls"). The template sees messages, tools (the object's "tools", else none), documents
 * (none), add_generation_prompt (false), bos_token and eos_token, as transformers' apply_chat_template
 * passes them.
 *
 * Which tokens count (as transformers' return_assistant_tokens_mask does): a template with
 * {% generation %} blocks counts the tokens that overlap the text those blocks wrote (the built-in
 * templates wrap the assistant's content and its end-of-turn token). A template without them (the
 * stock Llama 3 and Qwen templates) counts, for each assistant message i, the text that rendering
 * messages[0..i] adds to messages[0..i-1] rendered with add_generation_prompt, less trailing
 * whitespace: the assistant's content and its end-of-turn token. That needs the shorter renders to be
 * prefixes of the whole one; a template that renders earlier turns differently once later ones follow
 * (Qwen3's reasoning blocks in a multi-turn conversation) is refused for that conversation.
 *
 * Errors: ct_status with one line for ct_last_error(), prefixed with the conversation's FILE:LINE.
 */
#ifndef CTITAN_CHAT_H
#define CTITAN_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

typedef struct chat_template chat_template;

/* The names --chat-template takes besides a file. */
#define CHAT_BUILTINS "llama3, chatml"

/* choice: NULL for the chat_template of the tokenizer_config.json beside tokenizer_path (in it when
 * it is a folder), a built-in name, or a file holding a template. bos/eos: the tokenizer's. */
ct_status chat_template_load(const char *tokenizer_path, const char *choice, const ct_tokenizer *tok,
                             chat_template **out);
void chat_template_free(chat_template *t);
/* Where the template came from, for the summary ("built-in llama3", "PATH/tokenizer_config.json"). */
const char *chat_template_origin(const chat_template *t);

/* One conversation: *ids (n of them) and *counted (1 where the token is an assistant token) are
 * malloc'd; where ("FILE:LINE") prefixes every message. */
ct_status chat_encode(const chat_template *t, const ct_tokenizer *tok, const json_t *conv, const char *where,
                      int32_t **ids, unsigned char **counted, size_t *n);

/* A prompt for generation: one user message `user` rendered with add_generation_prompt true and
 * tokenized (special tokens in the text are special), as transformers' apply_chat_template([{"role":
 * "user", "content": user}], add_generation_prompt=True) gives it. *ids (n of them) is malloc'd. */
ct_status chat_encode_prompt(const chat_template *t, const ct_tokenizer *tok, const char *user, int32_t **ids,
                             size_t *n);

/* The template's end-of-turn token: the last token that counts of a probe conversation (a user turn
 * and an assistant turn), which chat.h's rule makes the assistant's end-of-turn token (<|eot_id|>,
 * <|im_end|>). CT_ERR_INVALID when that token is not a special token (a template whose turns end in
 * plain text gives generation no token to stop at but the EOS). */
ct_status chat_end_of_turn(const chat_template *t, const ct_tokenizer *tok, int32_t *id);

#endif
