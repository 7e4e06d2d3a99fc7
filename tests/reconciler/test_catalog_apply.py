"""`manage.py apply -f catalog.yaml`: idempotent, all or nothing, field-level errors."""

import pytest
from django.core.management import CommandError, call_command

from fleet.models import EngineProfile, Model
from fleet.services import catalog

pytestmark = pytest.mark.django_db

CATALOG = """
models:
  - name: qwen2.5-7b
    replicas: 2
    placement_policy: spread
    replace_after_s: 120
    profile: h100
    profiles:
      - name: h100
        engine: vllm
        model_path: Qwen/Qwen2.5-7B-Instruct
        gpus_per_node: 1
        gpu_class: H100
      - name: cpu
        engine: llamacpp
        model_path: /models/qwen2.5-7b-q4.gguf
        min_memory_gb: 16
  - name: tiny
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/tiny.gguf
"""


def run_apply(tmp_path, text, *args):
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    from io import StringIO

    out = StringIO()
    call_command("apply", "-f", str(path), *args, stdout=out)
    return out.getvalue()


def test_apply_creates_models_and_profiles_and_says_so(tmp_path):
    out = run_apply(tmp_path, CATALOG)

    assert out.splitlines() == [
        "profile qwen2.5-7b/h100 created",
        "profile qwen2.5-7b/cpu created",
        "model qwen2.5-7b created",
        "profile tiny/cpu created",
        "model tiny created",
    ]
    qwen = Model.objects.get(name="qwen2.5-7b")
    assert (qwen.desired_replicas, qwen.placement_policy, qwen.replace_after_s) == (
        2,
        "spread",
        120,
    )
    assert qwen.active_profile.name == "h100"
    assert qwen.active_profile.gpu_class == "H100"
    assert Model.objects.get(name="tiny").active_profile.name == "cpu"  # the only one


def test_applying_the_same_file_again_changes_nothing(tmp_path):
    run_apply(tmp_path, CATALOG)
    before = list(EngineProfile.objects.values_list("pk", "updated_at"))

    out = run_apply(tmp_path, CATALOG)

    assert out.strip() == "nothing to change"
    assert list(EngineProfile.objects.values_list("pk", "updated_at")) == before


def test_an_edit_reports_each_changed_field(tmp_path):
    run_apply(tmp_path, CATALOG)
    edited = CATALOG.replace("replicas: 2", "replicas: 3").replace("profile: h100", "profile: cpu")

    out = run_apply(tmp_path, edited)

    assert out.splitlines() == [
        "model qwen2.5-7b: desired_replicas 2 → 3, active profile 'h100' → 'cpu'",
        "unchanged: model tiny",
    ]
    assert Model.objects.get(name="qwen2.5-7b").active_profile.name == "cpu"


def test_prefix_routing_is_turned_on_in_the_file_and_off_by_leaving_it_out(tmp_path):
    on = CATALOG.replace("    replicas: 2\n", "    replicas: 2\n    prefix_routing: true\n")

    out = run_apply(tmp_path, on)

    assert Model.objects.get(name="qwen2.5-7b").prefix_routing is True
    assert Model.objects.get(name="tiny").prefix_routing is False  # the default
    assert "model qwen2.5-7b created" in out
    out = run_apply(tmp_path, CATALOG)
    assert out.splitlines()[0] == "model qwen2.5-7b: prefix_routing True → False"
    assert Model.objects.get(name="qwen2.5-7b").prefix_routing is False


def test_dry_run_changes_nothing(tmp_path):
    out = run_apply(tmp_path, CATALOG, "--dry-run")

    assert "would change: model tiny created" in out
    assert Model.objects.count() == 0


BAD = """
models:
  - name: good
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /m.gguf
  - name: bad
    replicas: -1
    profiles:
      - name: gpu
        engine: vllm
        model_path: /m
        gpus_per_node: 4
        tp: 3
        node_selector: "gpu in (h100)"
      - name: odd
        engine: tensorrt
        model_path: /m
"""


def test_bad_input_names_every_field_and_changes_nothing(tmp_path):
    with pytest.raises(CommandError) as err:
        run_apply(tmp_path, BAD)

    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'catalog.yaml'}: nothing applied:")
    assert "model bad.desired_replicas: replicas cannot be negative (got -1)" in text
    assert (
        "profile bad/gpu.tp: tp × pp (3 × 1 = 3) must equal gpus_per_node × nodes (4 × 1 = 4)"
        in text
    )
    assert "profile bad/gpu.node_selector: 'gpu in (h100)' is not a valid selector term" in text
    assert "profile bad/odd.engine:" in text and "tensorrt" in text
    assert Model.objects.count() == 0  # not even the good one


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "models: [",
            "not valid YAML: line 1, column 10: "
            "expected the node content, but found '<stream end>'",
        ),
        ("- a\n- b\n", "the file must be a mapping with a list under 'models'"),
        ("models: []\nextra: 1\n", "unknown top-level key(s): extra"),
        ("models:\n  - replicas: 1\n", "models[0].name: required"),
        ("models:\n  - name: a\n  - name: a\n", "models[1].name: model 'a' appears twice"),
        ("models:\n  - name: a\n    replica: 2\n", "model a: unknown field 'replica'"),
        (
            "models:\n  - name: a\n    profiles:\n      - name: p\n        tpp: 2\n",
            "model a.profiles[0]: unknown field 'tpp'",
        ),
        (
            "models:\n  - name: a\n    profile: nope\n",
            "model a.profile: no profile named 'nope' for this model",
        ),
        (
            "models:\n  - name: a\n    replicas: lots\n",
            "model a.desired_replicas: “lots” value must be an integer.",
        ),
        (
            "models:\n  - name: a\n    prefix_routing: sometimes\n",
            "model a.prefix_routing: “sometimes” value must be either True or False.",
        ),
    ],
)
def test_malformed_files_are_refused_with_the_reason(text, message):
    with pytest.raises(catalog.CatalogError) as err:
        catalog.apply(text)

    assert message in err.value.errors
    assert Model.objects.count() == 0


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read .*nope.yaml: No such file"):
        call_command("apply", "-f", str(tmp_path / "nope.yaml"))


def test_apply_sets_the_wanted_engines_and_leaves_the_others_alone(tmp_path):
    from fleet.models import WantedEngine

    WantedEngine.objects.create(engine="sglang", version="0.5.5")
    text = "engines:\n  vllm: 0.11.2\n  llamacpp: 0.3.36\n"

    assert run_apply(tmp_path, text).splitlines() == [
        "engine vllm 0.11.2 wanted",
        "engine llamacpp 0.3.36 wanted",
    ]
    assert run_apply(tmp_path, text.replace("0.11.2", "0.11.3")).splitlines() == [
        "engine vllm: version 0.11.2 -> 0.11.3",
        "unchanged: engine llamacpp",
    ]
    assert dict(WantedEngine.objects.values_list("engine", "version")) == {
        "llamacpp": "0.3.36",
        "sglang": "0.5.5",
        "vllm": "0.11.3",
    }


@pytest.mark.parametrize(
    "text, says",
    [
        ("engines:\n  vllm: 0.11\n", "engines.vllm: the version must be text; quote it"),
        ("engines: [vllm]\n", "engines: must be a mapping of engine: version"),
        ("engines:\n  vlm: 0.11.2\n", "engines.vlm"),
    ],
)
def test_bad_engines_apply_nothing_and_say_which(tmp_path, text, says):
    from fleet.models import WantedEngine

    with pytest.raises(CommandError, match="nothing applied") as err:
        run_apply(tmp_path, text)
    assert says in str(err.value)
    assert not WantedEngine.objects.exists()


FALLBACKS = """
models:
  - name: big
    fallbacks: [small]
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/big.gguf
  - name: small
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/small.gguf
"""


def test_a_fallback_may_be_a_model_later_in_the_same_file():
    catalog.apply(FALLBACKS)

    assert Model.objects.get(name="big").fallbacks == ["small"]


@pytest.mark.parametrize(
    "fallbacks, message",
    [
        ("[smal]", "model big.fallbacks: no model named 'smal'"),
        ("[big]", "model big.fallbacks: 'big' cannot fall back to itself"),
        ("[small, small]", "model big.fallbacks: a fallback is named twice: ['small', 'small']"),
        ("small", "model big.fallbacks: fallbacks must be a list of model names"),
    ],
)
def test_a_bad_fallback_is_refused_naming_it_and_nothing_is_applied(fallbacks, message):
    with pytest.raises(catalog.CatalogError) as err:
        catalog.apply(FALLBACKS.replace("[small]", fallbacks))

    assert any(e.startswith(message) for e in err.value.errors), err.value.errors
    assert Model.objects.count() == 0


CANARY = """
models:
  - name: qwen
    replicas: 4
    profile: bf16
    canary_profile: fp8
    canary_percent: 25
    profiles:
      - name: bf16
        engine: llamacpp
        model_path: /models/qwen-bf16.gguf
      - name: fp8
        engine: llamacpp
        model_path: /models/qwen-fp8.gguf
"""


def test_a_canary_is_declared_in_the_file_and_dropped_by_leaving_it_out():
    result = catalog.apply(CANARY)

    model = Model.objects.get(name="qwen")
    assert (model.canary_profile.name, model.canary_percent) == ("fp8", 25)
    assert catalog.apply(CANARY).changes == [], "applying it again changes nothing"
    assert result.changes

    without = CANARY.replace("    canary_profile: fp8\n    canary_percent: 25\n", "")
    assert catalog.apply(without).changes == [
        "model qwen: canary_percent 25 → 0, canary 'fp8' → None"
    ]
    model.refresh_from_db()
    assert model.canary_profile is None


@pytest.mark.parametrize(
    "change, message",
    [
        (
            "canary_profile: fp16",
            "model qwen.canary_profile: no profile named 'fp16' for this model",
        ),
        ("canary_profile: bf16", "model qwen.canary_profile: 'bf16' is the active profile already"),
        (
            "canary_percent: 100",
            "model qwen.canary_percent: Ensure this value is less than or equal to 99.",
        ),
    ],
)
def test_a_bad_canary_is_refused_naming_it(change, message):
    key = change.split(":")[0]
    line = next(ln for ln in CANARY.splitlines() if ln.strip().startswith(key + ":"))
    with pytest.raises(catalog.CatalogError) as err:
        catalog.apply(CANARY.replace(line, "    " + change))

    assert message in err.value.errors, err.value.errors
    assert Model.objects.count() == 0
