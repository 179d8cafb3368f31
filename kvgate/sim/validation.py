"""What vLLM 0.32's OpenAI server refuses, and how it says so: a request body checked in vLLM's order.

vLLM checks a request in three layers, and each has its own error shape, which clients and the
gateway see, so the simulator keeps them apart:

1. FastAPI and pydantic: the content type must be JSON, the body must parse, and each field must
   coerce to its type in pydantic's lax mode (``"9"`` and ``true`` are integers, ``"yes"`` is a
   boolean, ``2.5`` is not an integer). A failure is a 400 of type ``Bad Request`` whose ``param``
   is the location (``body.max_tokens``, ``body.58`` for a JSON error at offset 58).
2. The served model: an unknown name is a 404 ``NotFoundError``, before any sampling check.
3. The sampling parameters and the prompt: 400 ``BadRequestError``, ``param`` naming the field
   where vLLM names one (``max_tokens``, ``temperature``, ``input_tokens``) and null where it does
   not (``n``, ``min_tokens``, an empty conversation).

The context window is checked as vLLM does once the prompt is counted (``fit_to_context``): a
prompt longer than ``max_model_len`` is refused, but a prompt plus ``max_tokens`` past it is not,
the output is cut to what is left of the window and ends with ``finish_reason`` ``length``.
Validation returns an ``ApiError`` value and never raises: bad input gets an answer, not a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from kvgate.sim.protocol import ApiError

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_WORDS = frozenset({"0", "off", "f", "false", "n", "no"})


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    chat: bool
    model: str
    prompts: list[str | list[int]]
    """A completions request's prompts, text or token ids: each runs as its own request, as in vLLM."""
    messages: list[dict[str, Any]]
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    min_tokens: int
    kv_transfer_params: dict[str, Any] | None
    """P/D disaggregation metadata, passed through as vLLM's connectors receive it."""

    @property
    def remote_prefill(self) -> bool:
        """The prompt's KV was computed by a prefill instance (``do_remote_prefill``)."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))


def bad_request(message: str, param: str | None = None) -> ApiError:
    """vLLM's own refusal of a request that parsed (layer 3)."""
    return ApiError(400, message, "BadRequestError", param)


def schema_error(kind: str, loc: str, msg: str, value: object) -> ApiError:
    """FastAPI's refusal of a body that does not fit the request model (layer 1), worded as vLLM
    renders pydantic's first error."""
    detail = {"type": kind, "loc": loc, "msg": msg, "input": _input_text(value)}
    return ApiError(400, f"1 validation error:\n  {detail}", "Bad Request", loc)


def _input_text(value: object) -> str:
    if isinstance(value, dict | list):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def model_not_found(model: str, served_model: str) -> ApiError:
    return ApiError(
        404, f"The model `{model}` does not exist. Valid aliases: {served_model}.", "NotFoundError", "model"
    )


def content_type_error(content_type: bytes | None) -> ApiError | None:
    """vLLM's POST routes take JSON only; parameters after the media type (a charset) are fine."""
    media_type = (content_type or b"").split(b";", 1)[0].strip().lower()
    if media_type == b"application/json":
        return None
    return ApiError(
        400,
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
        "Bad Request",
    )


def parse_body(raw: bytes) -> dict[str, Any] | ApiError:
    """A JSON object, or vLLM's answer to a body that is not one."""
    if not raw.strip():
        return schema_error("missing", "body", "Field required", None)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return schema_error("json_invalid", f"body.{exc.pos}", "JSON decode error", {})
    if not isinstance(body, dict):
        return schema_error(
            "model_attributes_type", "body", "Input should be a valid dictionary or object", body
        )
    return body


def _lax_int(body: dict[str, Any], name: str) -> int | ApiError | None:
    """Pydantic's lax integer: ints, booleans, whole floats and numeric strings."""
    value = body.get(name)
    if value is None or isinstance(value, int):
        return None if value is None else int(value)
    loc = f"body.{name}"
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        message = "Input should be a valid integer, got a number with a fractional part"
        return schema_error("int_from_float", loc, message, value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            message = "Input should be a valid integer, unable to parse string as an integer"
            return schema_error("int_parsing", loc, message, value)
    return schema_error("int_type", loc, "Input should be a valid integer", value)


def _lax_float(body: dict[str, Any], name: str) -> float | ApiError | None:
    value = body.get(name)
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            message = "Input should be a valid number, unable to parse string as a number"
            return schema_error("float_parsing", f"body.{name}", message, value)
    return schema_error("float_type", f"body.{name}", "Input should be a valid number", value)


def _lax_bool(body: dict[str, Any], name: str) -> bool | ApiError:
    """Pydantic's lax boolean: booleans, 0 and 1, and words such as ``"yes"`` and ``"off"``."""
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    return schema_error("bool_parsing", f"body.{name}", "Input should be a valid boolean", value)


def _object(body: dict[str, Any], name: str, kind: str = "dict_type") -> dict[str, Any] | ApiError | None:
    value = body.get(name)
    if value is None or isinstance(value, dict):
        return value
    return schema_error(kind, f"body.{name}", "Input should be a valid dictionary", value)


def _schema_messages(body: dict[str, Any]) -> list[dict[str, Any]] | ApiError:
    if "messages" not in body:
        return schema_error("missing", "body.messages", "Field required", body)
    messages = body["messages"]
    if not isinstance(messages, list):
        return schema_error("list_type", "body.messages", "Input should be a valid list", messages)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            # vLLM's message type is a union; pydantic reports its first member's error first.
            loc = f"body.messages.{index}.ChatCompletionDeveloperMessageParam"
            return schema_error("dict_type", loc, "Input should be a valid dictionary", message)
    return messages


def _schema_prompt(prompt: Any) -> list[str | list[int]] | ApiError | None:
    """vLLM's completions ``prompt`` forms as a list of prompts (each its own request), or None."""
    if prompt is None or isinstance(prompt, str):
        return None if prompt is None else [prompt]
    if not isinstance(prompt, list):
        return schema_error("list_type", "body.prompt", "Input should be a valid list", prompt)
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    for index, item in enumerate(prompt):
        if not (isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)):
            return schema_error("list_type", f"body.prompt.{index}", "Input should be a valid list", item)
    return [list(p) for p in prompt]


@dataclass(frozen=True, slots=True)
class _Fields:
    """A generation body's fields once their types are checked (layer 1)."""

    model: str | None
    messages: list[dict[str, Any]]
    prompts: list[str | list[int]] | None
    max_tokens: int | None
    max_tokens_param: str
    n: int | None
    min_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool
    stream_options: dict[str, Any] | None
    ignore_eos: bool
    kv_transfer_params: dict[str, Any] | None


def _schema(body: dict[str, Any], chat: bool) -> _Fields | ApiError:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return schema_error("string_type", "body.model", "Input should be a valid string", model)
    messages = _schema_messages(body) if chat else []
    if isinstance(messages, ApiError):
        return messages
    prompts = None if chat else _schema_prompt(body.get("prompt"))
    if isinstance(prompts, ApiError):
        return prompts
    max_tokens_param = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens_param = "max_completion_tokens"
    read = _FieldReader(body)
    fields = _Fields(
        model=model,
        messages=messages,
        prompts=prompts,
        max_tokens=read.integer(max_tokens_param),
        max_tokens_param=max_tokens_param,
        n=read.integer("n"),
        min_tokens=read.integer("min_tokens"),
        temperature=read.number("temperature"),
        top_p=read.number("top_p"),
        stream=read.flag("stream"),
        stream_options=read.mapping("stream_options", "model_attributes_type"),
        ignore_eos=read.flag("ignore_eos"),
        kv_transfer_params=read.mapping("kv_transfer_params"),
    )
    return read.error or fields


class _FieldReader:
    """Typed fields of one body; the first field that does not coerce is kept as ``error`` (vLLM
    answers with pydantic's first error) and reads as None or False."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body
        self.error: ApiError | None = None

    def _keep(self, value: Any) -> Any:
        if isinstance(value, ApiError):
            self.error = self.error or value
            return None
        return value

    def integer(self, name: str) -> int | None:
        value: int | None = self._keep(_lax_int(self._body, name))
        return value

    def number(self, name: str) -> float | None:
        value: float | None = self._keep(_lax_float(self._body, name))
        return value

    def flag(self, name: str) -> bool:
        return bool(self._keep(_lax_bool(self._body, name)))

    def mapping(self, name: str, kind: str = "dict_type") -> dict[str, Any] | None:
        value: dict[str, Any] | None = self._keep(_object(self._body, name, kind))
        return value


def _sampling_error(fields: _Fields, max_model_len: int) -> ApiError | None:
    """Layer 3 before the prompt is counted, in vLLM's order."""
    if fields.stream_options is not None and not fields.stream:
        return bad_request(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        )
    max_tokens, name = fields.max_tokens, fields.max_tokens_param
    if max_tokens is not None and max_tokens > max_model_len:
        return bad_request(
            f"{name}={max_tokens} cannot be greater than max_model_len={max_model_len}. Please request "
            f"fewer output tokens. (parameter={name}, value={max_tokens})",
            name,
        )
    if fields.n is not None and fields.n < 1:
        return bad_request(f"n must be at least 1, got {fields.n}.")
    if fields.temperature is not None and fields.temperature < 0:
        return bad_request(
            f"temperature must be non-negative, got {fields.temperature}. "
            f"(parameter=temperature, value={fields.temperature})",
            "temperature",
        )
    if fields.top_p is not None and not 0 < fields.top_p <= 1:
        return bad_request(
            f"top_p must be in (0, 1], got {fields.top_p}. (parameter=top_p, value={fields.top_p})", "top_p"
        )
    if fields.min_tokens is not None and max_tokens is not None and fields.min_tokens > max_tokens:
        return bad_request(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {fields.min_tokens}."
        )
    return None


def _prompt_error(fields: _Fields, chat: bool) -> ApiError | None:
    if chat:
        if not fields.messages:
            return bad_request(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        return None
    prompts = fields.prompts
    if prompts is None or prompts == [""]:
        return bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", "prompt"
        )
    if not prompts:
        return bad_request("You must pass at least one prompt")
    if any(len(p) == 0 for p in prompts):
        return bad_request("The decoder prompt cannot be empty")
    return None


def parse_generation(
    raw: bytes, chat: bool, served_model: str, max_model_len: int
) -> GenerationRequest | ApiError:
    """A chat or completions body checked as vLLM checks it, up to (not including) the context
    window, which needs the prompt counted (``fit_to_context``)."""
    body = parse_body(raw)
    if isinstance(body, ApiError):
        return body
    fields = _schema(body, chat)
    if isinstance(fields, ApiError):
        return fields
    model = fields.model or served_model
    if model != served_model:
        return model_not_found(model, served_model)
    error = _sampling_error(fields, max_model_len) or _prompt_error(fields, chat)
    if error is not None:
        return error
    max_tokens = fields.max_tokens
    if max_tokens is None and not chat:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    return GenerationRequest(
        chat=chat,
        model=model,
        prompts=fields.prompts or [],
        messages=fields.messages,
        max_tokens=max_tokens,
        n=fields.n or 1,
        stream=fields.stream,
        include_usage=bool(fields.stream_options and fields.stream_options.get("include_usage")),
        ignore_eos=fields.ignore_eos,
        min_tokens=fields.min_tokens or 0,
        kv_transfer_params=fields.kv_transfer_params,
    )


def fit_to_context(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> int | ApiError:
    """The output cap vLLM runs a prompt with: ``max_tokens`` (or, when absent, all of it) cut to
    what the prompt leaves of the window; a prompt past the window, or one that leaves no room for a
    token, is refused as vLLM words it."""
    if prompt_tokens > max_model_len:
        reported = max_model_len + 1  # vLLM stops counting one token past the window
        return bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains at least {reported} input tokens, which exceeds this limit even without any "
            f"output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={reported})",
            "input_tokens",
        )
    room = max_model_len - prompt_tokens
    cap = room if max_tokens is None else min(max_tokens, room)
    if cap < 1:
        return bad_request(
            f"max_tokens must be at least 1, got {cap}. (parameter=max_tokens, value={cap})", "max_tokens"
        )
    return cap


def tokenize_request(raw: bytes, served_model: str) -> tuple[bool, Any] | ApiError:
    """``POST /tokenize``: (True, messages) for the chat form, (False, text) for the prompt form."""
    body = parse_body(raw)
    if isinstance(body, ApiError):
        return body
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return schema_error("string_type", "body.model", "Input should be a valid string", model)
    if "messages" in body:
        messages = _schema_messages(body)
        if isinstance(messages, ApiError):
            return messages
        if model and model != served_model:
            return model_not_found(model, served_model)
        if not messages:
            return bad_request(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        return True, messages
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        if prompt is None:
            return schema_error("missing", "body.prompt", "Field required", body)
        return schema_error("string_type", "body.prompt", "Input should be a valid string", prompt)
    if model and model != served_model:
        return model_not_found(model, served_model)
    return False, prompt
