"""Gemma 4's chat for the tests: a template written to mirror the real one (turns between
<|turn>ROLE and <turn|>, the system turn with the tools' declarations, calls as
<|tool_call>call:NAME{k:v}<tool_call|>, results as <|tool_response>response:NAME{value:...}
<tool_response|> in the same model turn, <|think|> in the system turn when thinking, else an
empty thought channel opening the answer), and the
tiny dense model written as GGUF with Gemma's markers as control tokens."""

from __future__ import annotations

from pathlib import Path

from gemma4_fixtures import gemma4, write_gemma4_gguf
from gguf_writing import Q, bpe_vocab

SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|channel>",
    "<channel|>",
    "<|think|>",
]

TEMPLATE = """{{- bos_token -}}
{%- set loop_messages = messages -%}
{%- set has_system = messages and messages[0]['role'] in ['system', 'developer'] -%}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- if tools or has_system or thinking -%}
    {{- '<|turn>system\\n' -}}
    {%- if thinking -%}
        {{- '<|think|>\\n' -}}
    {%- endif -%}
    {%- if has_system -%}
        {{- messages[0]['content'] | trim -}}
        {%- set loop_messages = messages[1:] -%}
    {%- endif -%}
    {%- for tool in tools or [] -%}
        {{- '<|tool>declaration:' + tool['function']['name'] -}}
        {{- tool['function'] | tojson -}}
        {{- '<tool|>' -}}
    {%- endfor -%}
    {{- '<turn|>\\n' -}}
{%- endif -%}
{%- set ns = namespace(prev=None) -%}
{%- for message in loop_messages -%}
    {%- if message['role'] == 'tool' -%}
        {%- set found = namespace(name='unknown') -%}
        {%- for earlier in messages -%}
            {%- for call in earlier.get('tool_calls') or [] -%}
                {%- if call.get('id') == message.get('tool_call_id') -%}
                    {%- set found.name = call['function']['name'] -%}
                {%- endif -%}
            {%- endfor -%}
        {%- endfor -%}
        {{- '<|tool_response>response:' + found.name + '{value:<|"|>' + message['content'] -}}
        {{- '<|"|>}<tool_response|>' -}}
        {%- set ns.prev = 'tool_response' -%}
    {%- else -%}
        {%- if not (message['role'] == 'assistant' and ns.prev == 'tool_response') -%}
            {{- '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) -}}
            {{- '\\n' -}}
        {%- endif -%}
        {%- set ns.prev = None -%}
        {%- for call in message.get('tool_calls') or [] -%}
            {{- '<|tool_call>call:' + call['function']['name'] + '{' -}}
            {%- for key, value in call['function']['arguments'] | dictsort -%}
                {{- key + ':' -}}
                {%- if value is string -%}
                    {{- '<|"|>' + value + '<|"|>' -}}
                {%- else -%}
                    {{- value | tojson -}}
                {%- endif -%}
                {{- ',' if not loop.last -}}
            {%- endfor -%}
            {{- '}<tool_call|>' -}}
            {%- set ns.prev = 'tool_call' -%}
        {%- endfor -%}
        {%- if message['content'] is string -%}
            {{- message['content'] | trim -}}
        {%- endif -%}
        {%- if ns.prev != 'tool_call' -%}
            {{- '<turn|>\\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.prev not in ['tool_response', 'tool_call'] -%}
    {{- '<|turn>model\\n' -}}
    {%- if not thinking -%}
        {{- '<|channel>thought\\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"""


def gemma4_chat_gguf(path: Path) -> Path:
    """The tiny dense model with SPECIALS in its vocabulary and TEMPLATE, 1024 positions (the
    tools' declarations are long in byte-level tokens)."""
    vocab = len(bpe_vocab(SPECIALS))
    model = gemma4(
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        max_position_embeddings=1024,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    return write_gemma4_gguf(model, path, Q.Q8_0, SPECIALS, TEMPLATE)
