"""Pydantic models of the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models).

Field names and defaults follow OpenAI's API reference; SGLang's extension fields (top_k, min_p, regex,
json_schema, chat_template_kwargs, separate_reasoning, ...) are typed here too. No key is silently ignored:
keys not declared here are kept aside (extra="allow") and judged by field_policy.check_extra_fields, which
accepts OpenAI's label-only fields (user, metadata, ...) and answers every other one with a 400 naming it.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt option is a 400 naming it

    include_usage: bool = False
    # OpenAI's padding of stream events against length side channels: a transport hint, the answer is the same;
    # this server adds no padding either way.
    include_obfuscation: Optional[bool] = None


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")  # undeclared keys: see field_policy.check_extra_fields

    model: Optional[str] = None  # any name is accepted (one model per server, as in SGLang)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    seed: Optional[int] = None
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    logit_bias: Optional[Dict[str, float]] = None
    # SGLang extensions
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    spaces_between_special_tokens: bool = True
    rid: Optional[str] = None
    # SGLang's constraint and stop keys: handed to the sampling parameters, so they do exactly what they do
    # in /generate's sampling_params (constrained decoding, unless the server runs --grammar-backend none: then a 400 naming the key).
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Optional[str] = None
    structural_tag: Optional[str] = None
    stop_regex: Optional[Union[str, List[str]]] = None
    custom_params: Optional[Dict[str, Any]] = None


class CompletionRequest(_SamplingRequest):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    response_format: Optional[Dict[str, Any]] = None  # as on chat (upstream SGLang accepts it here too)
    max_tokens: Optional[int] = 16  # OpenAI's default for the legacy completions API
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class ChatContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str = ""  # a JSON text, as OpenAI sends it


class ToolCallIn(BaseModel):
    """An assistant message's earlier tool call, sent back in the conversation history."""

    model_config = ConfigDict(extra="forbid")

    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCallIn
    index: Optional[int] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt message key is a 400 naming it

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, List[ChatContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCallIn]] = None  # assistant
    tool_call_id: Optional[str] = None  # tool
    function_call: Optional[FunctionCallIn] = None  # assistant, OpenAI's legacy functions API
    reasoning_content: Optional[str] = None  # assistant: its earlier thinking (SGLang's field)
    refusal: Optional[str] = None  # assistant: a refusal OpenAI returned earlier, shown as its text
    # What the openai client sends back when a returned message is appended to the conversation:
    # citations of an earlier answer (its text already holds them) and audio (refused by name when set).
    annotations: Optional[List[Dict[str, Any]]] = None
    audio: Optional[Dict[str, Any]] = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(_SamplingRequest):
    messages: List[ChatMessage]
    max_tokens: Optional[int] = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: bool = True
    functions: Optional[List[FunctionDefinition]] = None  # OpenAI's legacy form of tools
    function_call: Optional[Union[str, Dict[str, Any]]] = None  # ... and of tool_choice
    response_format: Optional[Dict[str, Any]] = None
    modalities: Optional[List[str]] = None
    # SGLang's chat extensions
    chat_template_kwargs: Optional[Dict[str, Any]] = None  # extra variables for the template (enable_thinking)
    continue_final_message: bool = False  # the last (assistant) message is continued, not answered
    separate_reasoning: bool = True  # with --reasoning-parser: thinking in reasoning_content
    stream_reasoning: bool = True  # stream reasoning_content as it comes (false: in the last chunk)


# ------------------------------------------------------------------ responses
class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(BaseModel):
    tokens: List[str] = Field(default_factory=list)
    token_logprobs: List[Optional[float]] = Field(default_factory=list)  # null for the first prompt token
    top_logprobs: Optional[List[Optional[Dict[str, float]]]] = None
    text_offset: List[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[CompletionChoice]
    usage: Optional[UsageInfo] = None


class ChatLogProbToken(BaseModel):
    token: str
    logprob: float
    bytes: Optional[List[int]] = None
    top_logprobs: List[Dict[str, Any]] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: List[ChatLogProbToken] = Field(default_factory=list)


class FunctionCallOut(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class ToolCallOut(BaseModel):
    id: Optional[str] = None
    index: Optional[int] = None
    type: Optional[Literal["function"]] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[ToolCallOut]] = None
    function_call: Optional[FunctionCallOut] = None  # the legacy functions API's form of one call


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatChoice]
    usage: Optional[UsageInfo] = None


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[ToolCallOut]] = None
    function_call: Optional[FunctionCallOut] = None  # the legacy functions API's form of one call


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: str = "list"
    data: List[ModelCard]


class TokenizeRequest(BaseModel):
    """/tokenize (alias /v1/tokenize), SGLang's shape."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    prompt: Union[str, List[str]]
    add_special_tokens: bool = True


class TokenizeResponse(BaseModel):
    tokens: Union[List[int], List[List[int]]]
    count: Union[int, List[int]]
    max_model_len: int


class DetokenizeRequest(BaseModel):
    """/detokenize (alias /v1/detokenize), SGLang's shape."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    tokens: Union[List[int], List[List[int]]]
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: Union[str, List[str]]
