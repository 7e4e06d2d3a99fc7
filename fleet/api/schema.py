"""What the OpenAPI schema says beyond drf-spectacular's reading of the views: the errors.

drf-spectacular documents the answer an operation gives when it works. A client
generated from the schema also has to know the others, and their bodies (the
shapes fleet/api/exceptions.py describes), so ``document_errors`` (a
postprocessing hook, SPECTACULAR_SETTINGS) adds to each operation the statuses
it can answer:

- every one: 401 (no key, or a wrong, revoked or expired one), 403 (a key whose
  user lacks the permission, or a browser session without its CSRF token) and
  429 (an address locked out after too many unknown keys);
- one with an ``{id}`` in its path: 404;
- a list: 400 (a filter or page parameter the API refuses);
- one with a body: 400 (the fields, or a body that is not JSON), 409 (a name
  that is taken) and 415 (a body that is not ``application/json``);
- a DELETE: 409 (something still uses it).

It also marks a list's filters ``allowEmptyValue``: django-filter, DRF's search
and ordering take ``?state=`` as no filter at all, and the schema says so.

A view documents anything else itself (``extend_schema(responses={409:
OpenApiResponse(description=...)})``); what it says wins, and its error bodies
are filled in.
"""

ERROR = "Error"
VALIDATION_ERROR = "ValidationError"
ANY_ERROR = "AnyError"

COMPONENTS = {
    ERROR: {
        "type": "object",
        "description": "Every error but a field error: what was wrong, in a sentence.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "example": {"detail": "No Node matches the given query."},
    },
    VALIDATION_ERROR: {
        "type": "object",
        "description": (
            "Field errors: each wrong field (a query parameter for a list) with its "
            "messages; `non_field_errors` for a rule across fields. A field of a list "
            "or map nests its errors by index or key."
        ),
        "additionalProperties": {
            "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object"}]
        },
        "example": {"desired_replicas": ["Ensure this value is greater than or equal to 0."]},
    },
    ANY_ERROR: {
        "description": "Field errors, or an Error (a body that could not be parsed, say).",
        "oneOf": [
            {"$ref": f"#/components/schemas/{VALIDATION_ERROR}"},
            {"$ref": f"#/components/schemas/{ERROR}"},
        ],
    },
}

WHY = {
    400: "The request is invalid; the body says which field or parameter, and why.",
    401: "No API key, or one that is unknown, revoked, expired or not a manage key.",
    403: "The key's user lacks the permission this needs (or a session lacks its CSRF token).",
    404: "Nothing with this id.",
    409: "It conflicts with what exists: a name already taken, or it is still in use.",
    415: "The body is not application/json, the only type the API reads.",
    429: "Too many unknown API keys from this address: it is locked out for a while.",
}
EXAMPLES = {
    401: {"detail": "unknown API key"},
    403: {"detail": "You do not have permission to perform this action."},
    404: {"detail": "No Node matches the given query."},
    409: {"detail": "model 'qwen-7b' is in use by 1 object(s): replica 3f2a1b"},
    415: {"detail": 'Unsupported media type "text/plain" in request.'},
    429: {
        "detail": "too many unknown API keys from this address; it is locked out "
        "Expected available in 900 seconds."
    },
}
METHODS = ("get", "put", "post", "patch", "delete")


def error_response(status: int) -> dict:
    # A duplicate is a field error (the field that is taken) answered 409.
    component = ANY_ERROR if status in (400, 409) else ERROR
    body = {"schema": {"$ref": f"#/components/schemas/{component}"}}
    if status in EXAMPLES:
        body["example"] = EXAMPLES[status]
    return {"description": WHY.get(status, "An error."), "content": {"application/json": body}}


def error_statuses(path: str, method: str, operation: dict) -> list[int]:
    """The error statuses an operation can answer, by the rules in the module's docstring."""
    statuses = [401, 403, 429]
    if "{" in path:
        statuses.append(404)
    if method == "get" and "{" not in path:
        statuses.append(400)
    if "requestBody" in operation:
        statuses += [400, 409, 415]
    if method == "delete":
        statuses.append(409)
    return sorted(set(statuses))


PAGE_PARAMETERS = {"limit", "offset"}


def _empty_is_no_filter(operation: dict) -> None:
    """A list's filters, search and ordering take an empty value (``?state=``) as absent."""
    for param in operation.get("parameters", []):
        if param.get("in") == "query" and param["name"] not in PAGE_PARAMETERS:
            param["allowEmptyValue"] = True


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: error responses and their components."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
    for path, item in result.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            if method == "get" and "{" not in path:
                _empty_is_no_filter(operation)
            responses = operation.setdefault("responses", {})
            for status in error_statuses(path, method, operation):
                responses.setdefault(str(status), error_response(status))
            # A view that names an error status of its own says why; the body is the same.
            for status, response in responses.items():
                if int(status) >= 400 and "content" not in response:
                    response["content"] = error_response(int(status))["content"]
    return result
