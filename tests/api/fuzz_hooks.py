"""schemathesis hooks for tests/api/test_api_fuzz.py: valid requests that are valid.

A request body can follow the schema and still be refused, for reasons no JSON
Schema states: an id that names nothing in this database (``"model": 72``), an
engine profile whose ``tp × pp`` is not ``gpus_per_node × nodes`` or whose
checksums name files its model_path does not fetch (rules across fields,
EngineProfile.clean()), a model's autoscaling bounds or sleep that do not
fit together, a catalog file's YAML inside a string, or a duration ("24h") or time
the schema only describes in words. The API answers 400 to them, rightly; the
positive-data check would call that a valid request refused. So a *positive* case
(one schemathesis means to be valid) is made valid in those ways only, before it
is sent: ids point at the fleet the test made, the parallelism adds up, the
bounds fit, the catalog is a real one and durations are durations.
Negative cases are sent as drawn.

Loaded by the schemathesis command through ``SCHEMATHESIS_HOOKS``; the test
passes the seeded model's id in ``LLMGW_FUZZ_MODEL_ID``.
"""

import os

import schemathesis

GPU_ENGINES = ("vllm", "sglang")
# The fleet the test made, as a catalog file: applying it changes nothing.
CATALOG = """\
models:
  - name: qwen-7b
    replicas: 1
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/qwen-7b
"""


def _model_id() -> int:
    return int(os.environ["LLMGW_FUZZ_MODEL_ID"])


def _consistent_profile(body: dict) -> None:
    """The drawn profile, its parallelism made to add up (tp × pp = gpus_per_node × nodes)."""
    engine = body.get("engine") or "llamacpp"
    gpus = body.get("gpus_per_node") or 0
    if engine in GPU_ENGINES:
        gpus = max(gpus, 1)
    # A PATCH may leave out any of these; sending all five keeps the stored ones out of it.
    body.update(engine=engine, gpus_per_node=gpus, nodes=1, tp=max(gpus, 1), pp=1)
    # A share of GPU memory is a share of GPUs: a CPU profile has none.
    if not gpus:
        body["gpu_memory_gb"] = None
    # Checksums are for weights the node fetches, named as the URL names its file.
    sums = body.get("weights_sha256")
    if "model_path" in body and "weights_sha256" not in body:
        # A new model_path with the stored checksums may not fit together: send both.
        body["weights_sha256"] = {}
    elif isinstance(sums, dict) and sums:
        body.update(
            model_path="https://models.example/m.gguf",
            weights_sha256={"m.gguf": next(iter(sums.values()))},
        )


def _consistent_bounds(body: dict) -> None:
    """Autoscaling's bounds made to fit together (Model.clean()): both or neither, min at
    most max, and an idle time exactly when min is 0. All three are sent together."""
    keys = ("min_replicas", "max_replicas", "scale_to_zero_after_s")
    if not any(k in body for k in keys):
        return
    lo, hi = body.get("min_replicas"), body.get("max_replicas")
    if lo is None or hi is None:
        body.update(dict.fromkeys(keys))
        return
    idle = (body.get("scale_to_zero_after_s") or 60) if lo == 0 else None
    body.update(min_replicas=lo, max_replicas=max(hi, lo, 1), scale_to_zero_after_s=idle)


def _consistent_sleep(body: dict) -> None:
    """A stop after sleep only where it may be (Model._sleep_errors()): with min_replicas
    0 and sleep_after_s in the same body, so the stored model's do not decide it."""
    if body.get("min_replicas") != 0 or ("sleep_after_s" in body and not body["sleep_after_s"]):
        body["stop_after_asleep_s"] = None
    elif body.get("stop_after_asleep_s") is not None:
        body["sleep_after_s"] = body.get("sleep_after_s") or 60


def _amount(drawn) -> str:
    """Money as the decimal pattern draws it ("-12.5", ".", ""), made 0 or more: a
    negative amount and a bare point are refused by rules the pattern cannot say."""
    text = str(drawn).lstrip("-")
    try:
        float(text)
    except ValueError:
        return "2.50"
    return text


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if meta is not None and not meta.generation.mode.is_positive:
        return case
    return _made_valid(case)


@schemathesis.hook
def before_add_examples(context, examples):
    """The schema's own examples are meant to be valid too; their ids were written for a
    fresh database, where the first model is 1 (not so on PostgreSQL after other tests)."""
    for case in examples:
        _made_valid(case)


def _made_valid(case):
    path = case.operation.path
    if path == "/api/v1/usage/" and case.query and "since" in case.query:
        case.query["since"] = "7d"  # a duration or a time, in words only
    if path == "/api/v1/costs/" and case.query:
        # Dates or times in order (an end alone may come before this month, where the
        # start is by default), and what costs are reported by, in words only.
        if "start" in case.query or "end" in case.query:
            case.query.update(start="2026-11-01", end="2026-11-02")
        if "by" in case.query:
            case.query["by"] = "team,model"
    if not isinstance(case.body, dict):
        return case
    if path.startswith("/api/v1/engine-profiles/") and case.method in ("POST", "PUT", "PATCH"):
        if "model" in case.body or case.method != "PATCH":
            case.body["model"] = _model_id()
        _consistent_profile(case.body)
    elif path.startswith("/api/v1/models/") and case.method in ("POST", "PUT", "PATCH"):
        # A model's active profile must be one of its own; none is always one of them.
        if case.body.get("active_profile") is not None:
            case.body["active_profile"] = None
        if "canary_profile" in case.body or "canary_percent" in case.body:
            # A canary is another profile of the model's own, with a share: none here.
            case.body.update(canary_profile=None, canary_percent=0)
        if case.body.get("fallbacks"):
            case.body["fallbacks"] = []  # names of other models that exist, in words only
        if case.body.get("team") is not None:
            case.body["team"] = None  # a team that exists, in words only
        if case.body.get("private"):
            case.body["private"] = False  # kept to a team: the fuzz fleet's models have none
        name = case.body.get("name")
        if isinstance(name, str) and name.startswith("lora-"):
            # Adapters' names, which a link may carry over, are not models' (in words only).
            case.body["name"] = ("model-" + name[len("lora-") :])[:128]
        _consistent_bounds(case.body)
        _consistent_sleep(case.body)
    elif path.startswith("/api/v1/adapters/") and case.method in ("POST", "PUT", "PATCH"):
        if "model" in case.body or case.method != "PATCH":
            case.body["model"] = _model_id()
        if case.body.get("rank") is not None:
            case.body["rank"] = 16  # one of the ranks engines take, in words only
        if isinstance(case.body.get("name"), str):
            # Not a model's name (models and adapters share one namespace), in words only.
            if not case.body["name"].startswith("lora-"):
                case.body["name"] = ("lora-" + case.body["name"])[:128]
        # Checksums are for files the node fetches, named as the URL names its file: a
        # fetched source always, so checksums a link carries over fit it too.
        if "source" in case.body or case.method != "PATCH":
            case.body["source"] = "https://models.example/a.gguf"
        sums = case.body.get("sha256")
        if isinstance(sums, dict) and sums:
            case.body["sha256"] = {"a.gguf": next(iter(sums.values()))}
    elif path in ("/api/v1/catalog/apply/", "/api/v1/catalog/explain/"):
        if "catalog" in case.body or path.endswith("apply/"):
            case.body["catalog"] = CATALOG
    elif path.startswith("/api/v1/teams/") and case.method in ("POST", "PUT", "PATCH"):
        # A group that exists and is no other team's, in words only: a new team's is
        # made with it, a team's own is kept.
        case.body.pop("group", None)
        # A guarantee within the team's GPU memory quota (Team.clean()), in words only.
        quota, guaranteed = (
            case.body.get("max_gpu_memory_gb"),
            case.body.get("guaranteed_gpu_memory_gb"),
        )
        if isinstance(guaranteed, int) and guaranteed:
            if case.method == "PATCH" and "max_gpu_memory_gb" not in case.body:
                case.body["max_gpu_memory_gb"] = None  # the stored quota: sent with it
            elif isinstance(quota, int) and guaranteed > quota:
                case.body["guaranteed_gpu_memory_gb"] = quota
        # A budget of 0 or more in three capital letters, in words only.
        if case.body.get("budget_per_month") is not None:
            case.body["budget_per_month"] = _amount(case.body["budget_per_month"])
        if "budget_currency" in case.body:
            case.body["budget_currency"] = "EUR"
    elif path == "/api/v1/prices/" and case.method == "POST":
        # Three capital letters, a price of 0 or more and a time it can be, in words only.
        if "currency" in case.body:
            case.body["currency"] = "EUR"
        if "per_hour" in case.body:
            case.body["per_hour"] = _amount(case.body["per_hour"])
        if "effective_from" in case.body:
            case.body["effective_from"] = "2026-11-01T00:00:00Z"
    elif path == "/api/v1/join-tokens/":
        case.body["ttl"] = "24h"
    elif path == "/api/v1/api-keys/{prefix}/rotate/":
        case.body["grace"] = "1h"
    elif path == "/api/v1/api-keys/{prefix}/":
        case.body.pop("fallbacks", None)  # names of models that exist, in words only
    elif path == "/api/v1/api-keys/":
        case.body.pop("models", None)  # names of models that exist, in words only
        case.body.pop("fallbacks", None)
        case.body.pop("team", None)  # a team that exists, in words only
        if "user" in case.body:
            case.body["user"] = "fuzz"  # a user that exists: the test's own
        if "expires" in case.body:
            case.body["expires"] = "30d"
    return case
