"""A tiny random-weight model whose chat template is written here in Qwen3's format: ChatML
turns, tools in <tools>, calls in <tool_call>, results in <tool_response>, thinking in <think>
(enable_thinking=false writes an empty think block)."""

from __future__ import annotations

import json
from pathlib import Path

from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config

SPECIAL = ["<|im_start|>", "<|im_end|>"]
# Text-level markers, as in Qwen's tokenizer: added tokens that decode as text.
MARKERS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

QWEN3_STYLE_TEMPLATE = """
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{% if message.reasoning_content and loop.last %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}
{%- endif %}
"""


def write_qwen3_style_model(folder: Path) -> Path:
    """An HF folder: random weights over 256 byte tokens plus the chat template's tokens."""
    spec = json.loads(byte_tokenizer_json())
    added = SPECIAL + MARKERS
    spec["added_tokens"] = [
        {
            "id": 256 + i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": text in SPECIAL,
        }
        for i, text in enumerate(added)
    ]
    config = tiny_config(
        vocab=256 + len(added), eos_token_ids=[257], bos_token_id=256, context_length=1024
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_hf_folder(folder, config, random_weights(config, seed=3))
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    settings = {
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "chat_template": QWEN3_STYLE_TEMPLATE.lstrip("\n"),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder
