"""What a catalog file may say (``apply -f``; its example is ``catalog``'s), checked for
shape before anything in it is looked up or applied.

The keys each kind of entry may have (``MODEL_KEYS``, ``PROFILE_KEYS``,
``ADAPTER_KEYS``: anything else is refused), mappings and lists where they
belong, names present and not repeated, engines' versions as text, and the
prices' entries (``catalog_prices.check``). Every problem is reported at once,
each naming where it is. This changes when the file gains a key or a section;
what a key does to the rows is ``catalog``'s.
"""

import yaml

from agentd import safeyaml

from . import catalog_prices

# File key -> model field. Everything else in a model entry is refused.
MODEL_KEYS = {
    "name": "name",
    "description": "description",
    "replicas": "desired_replicas",
    "placement_policy": "placement_policy",
    "priority": "priority",
    "private": "private",
    "prefix_routing": "prefix_routing",
    "replace_after_s": "replace_after_s",
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "scale_to_zero_after_s": "scale_to_zero_after_s",
    "target_outstanding": "target_outstanding",
    "max_waiting": "max_waiting",
    "max_wait_s": "max_wait_s",
    "sleep_after_s": "sleep_after_s",
    "sleep_level": "sleep_level",
    "stop_after_asleep_s": "stop_after_asleep_s",
    "fallbacks": "fallbacks",
    "canary_percent": "canary_percent",
    "canary_max_error_rate": "canary_max_error_rate",
    "canary_max_ttft_ratio": "canary_max_ttft_ratio",
    "canary_window_s": "canary_window_s",
    "canary_min_requests": "canary_min_requests",
    "canary_auto_promote": "canary_auto_promote",
}
PROFILE_KEYS = {
    "name",
    "engine",
    "gpu_class",
    "tp",
    "pp",
    "gpus_per_node",
    "gpu_memory_gb",
    "nodes",
    "args",
    "env",
    "model_path",
    "weights_sha256",
    "served_model_name",
    "min_memory_gb",
    "context_tokens",
    "sequences",
    "node_selector",
    "startup_timeout_s",
    "max_adapters",
}
ADAPTER_KEYS = {"name", "description", "source", "sha256", "rank"}


def read(text: str) -> tuple[dict, list[str]]:
    """The whole file, checked for shape: its data (models, and engines and prices if
    named) and every problem, each naming its field; [] when there is none."""
    try:
        # No anchors or aliases, and a size bound: a 572-byte alias bomb once
        # took 32 s and 2 GB of the web process (agentd.safeyaml).
        data = safeyaml.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return {}, [f"not valid YAML: {where}{problem}"]
    if isinstance(data, dict) and {"engines", "prices"} & set(data) and "models" not in data:
        data = {**data, "models": []}
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        return {}, ["the file must be a mapping with a list under 'models'"]
    unknown = set(data) - {"models", "engines", "prices"}
    if unknown:
        return {}, [f"unknown top-level key(s): {', '.join(sorted(unknown))}"]
    # Adapters' names are the file's (they are asked for by name), profiles' each model's.
    errors, seen, adapters = [], set(), set()
    for i, entry in enumerate(data["models"]):
        where = f"models[{i}]"
        if not isinstance(entry, dict):
            errors.append(f"{where}: must be a mapping")
            continue
        name = entry.get("name")
        if not name:
            errors.append(f"{where}.name: required")
        elif name in seen:
            errors.append(f"{where}.name: model '{name}' appears twice")
        seen.add(name)
        where = f"model {name}" if name else where
        for key in sorted(
            set(entry)
            - set(MODEL_KEYS)
            - {"profile", "profiles", "canary_profile", "team", "adapters"}
        ):
            errors.append(f"{where}: unknown field '{key}'")
        errors += _check_named(entry.get("profiles", []), where, "profile", PROFILE_KEYS, set())
        errors += _check_named(entry.get("adapters", []), where, "adapter", ADAPTER_KEYS, adapters)
    engines = data.get("engines", {})
    if not isinstance(engines, dict):
        errors.append("engines: must be a mapping of engine: version, e.g. vllm: 0.11.2")
    else:
        for engine, version in engines.items():
            if not isinstance(version, str):
                errors.append(
                    f"engines.{engine}: the version must be text; quote it, e.g. '0.11.2'"
                )
    errors += catalog_prices.check(data.get("prices", []))
    return data, errors


def _check_named(items, where: str, kind: str, keys: set, seen: set) -> list[str]:
    """A model's list of profiles or adapters: mappings, each with a name not in ``seen``
    and no field outside ``keys``."""
    if not isinstance(items, list):
        return [f"{where}.{kind}s: must be a list"]
    errors = []
    for j, item in enumerate(items):
        iwhere = f"{where}.{kind}s[{j}]"
        if not isinstance(item, dict):
            errors.append(f"{iwhere}: must be a mapping")
            continue
        name = item.get("name")
        if not name:
            errors.append(f"{iwhere}.name: required")
        elif name in seen:
            errors.append(f"{iwhere}.name: {kind} '{name}' appears twice")
        seen.add(name)
        errors += [f"{iwhere}: unknown field '{k}'" for k in sorted(set(item) - keys)]
    return errors
