"""A profile's weights source and checksums: the same rules in the model, the API and apply -f,
and what reaches the agent's ProfileSpec."""

import pytest
from django.core.exceptions import ValidationError

from agentd import protocol
from agentd.fetch import sources
from fleet.models import EngineProfile, Model
from fleet.services import catalog

pytestmark = pytest.mark.django_db

SHA = "3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b"
CPU = {"name": "cpu", "engine": "llamacpp", "gpus_per_node": 0}


def profile(**fields) -> EngineProfile:
    model = Model.objects.create(name="tiny")
    return EngineProfile(model=model, **{**CPU, **fields})


@pytest.mark.parametrize(
    "path",
    [
        "/models/tiny.gguf",
        "Qwen/Qwen2.5-7B-Instruct",  # a hub id the engine resolves itself, as before
        "https://mirror.example/models/tiny-q4.gguf",
        "http://10.0.0.5:8080/tiny.gguf",
        "hf://Qwen/Qwen2.5-0.5B-Instruct",
        "hf://Qwen/Qwen2.5-0.5B-Instruct@a1b2c3d",
        "hf://org/name@refs/pr/1",
        "hf://TheBloke/Llama-2-7B-GGUF/llama-2-7b.Q4_K_M.gguf",  # one file of a repository
        "hf://unsloth/Qwen3-32B-GGUF/Q8_0@a1b2c3d",  # one folder, at a commit
    ],
)
def test_every_source_form_is_accepted(path):
    profile(model_path=path).full_clean()


@pytest.mark.parametrize(
    "path, words",
    [
        ("s3://bucket/tiny.gguf", "unknown scheme 's3://'"),
        ("https:///tiny.gguf", "names no host"),
        ("https://mirror.example/", "names no file"),
        ("https://user:pw@mirror.example/tiny.gguf", "carries credentials"),
        ("https://mirror.example:99999/tiny.gguf", "not a valid URL"),
        ("https://mirror.example/tiny.gguf#x", "has a fragment"),
        ("hf://just-a-name", "a hub source is hf://org/name[/path/in/repo][@revision]"),
        ("hf://org/na--me", "'na--me' is not a valid hub name"),
        ("hf://org/-name", "'-name' is not a valid hub name"),
        ("hf://org/name@", "nothing after '@'"),
        ("hf://org/name@../x", "'../x' is not a valid revision"),
        ("hf://org/name extra", "contains white space"),
        ("hf://org/name/", "'' is not a path in the repository"),
        ("hf://org/name/a/../b.gguf", "'a/../b.gguf' is not a path in the repository"),
        # the file after the revision, as some tools write it: the answer shows the order
        ("hf://org/name@main/x.gguf", "a file goes before it: hf://org/name/x.gguf@main"),
        ("hf://org/name@v2/Q8/x.GGUF", "a file goes before it: hf://org/name/Q8/x.GGUF@v2"),
    ],
)
def test_a_bad_source_is_an_error_naming_the_problem(path, words):
    with pytest.raises(ValidationError) as err:
        profile(model_path=path).full_clean()
    [message] = err.value.message_dict["model_path"]
    assert words in message


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"weights_sha256": {"tiny.gguf": "ABC"}}, "'ABC' is not a sha256"),
        ({"weights_sha256": {"tiny.gguf": SHA.upper()}}, "is not a sha256"),
        ({"weights_sha256": ["x"]}, "must map file names to sha256 hex digests"),
        ({"weights_sha256": {"other.gguf": SHA}}, "the URL fetches one file, tiny.gguf; not other"),
    ],
)
def test_bad_checksums_are_errors(fields, words):
    p = profile(model_path="https://mirror.example/tiny.gguf", **fields)
    with pytest.raises(ValidationError) as err:
        p.full_clean()
    assert any(words in m for m in err.value.message_dict["weights_sha256"])


HUB = "hf://org/tiny-GGUF"


@pytest.mark.parametrize(
    "path, names",
    [
        (f"{HUB}/tiny-Q8_0.gguf@v1", ["tiny-Q8_0.gguf"]),  # the file itself
        (f"{HUB}/Q8_0", ["Q8_0/a.gguf", "Q8_0/sub/b.gguf"]),  # what is under a folder
        (f"{HUB}/Q8_0/t-00001-of-00002.gguf", ["Q8_0/t-00002-of-00002.gguf"]),  # other parts
        (HUB, ["anything/at/all.gguf"]),  # the whole repository
    ],
)
def test_checksums_of_a_hub_path_name_files_it_fetches(path, names):
    profile(model_path=path, weights_sha256=dict.fromkeys(names, SHA)).full_clean()


@pytest.mark.parametrize(
    "path, name",
    [
        (f"{HUB}/tiny-Q8_0.gguf@v1", "tiny-Q4_K_M.gguf"),
        (f"{HUB}/Q8_0", "Q8_0.gguf"),  # beside the folder, not under it
        (f"{HUB}/Q8_0/t-00001-of-00002.gguf", "Q8_0/t-00001-of-00003.gguf"),
    ],
)
def test_checksums_of_a_file_a_hub_path_does_not_fetch_are_refused(path, name):
    p = profile(model_path=path, weights_sha256={name: SHA})
    with pytest.raises(ValidationError) as err:
        p.full_clean()
    [message] = err.value.message_dict["weights_sha256"]
    inside = path.removeprefix(f"{HUB}/").split("@")[0]
    assert f"fetches only {inside} " in message, message
    assert f"not {name}: name files by their path in the repository" in message


def test_checksums_need_a_fetched_source():
    p = profile(model_path="/models/tiny.gguf", weights_sha256={"tiny.gguf": SHA})
    with pytest.raises(ValidationError, match="checksums are for files the node fetches"):
        p.full_clean()


def test_checksums_reach_the_agents_profile_spec():
    p = profile(model_path="hf://org/tiny@v1", weights_sha256={"sub/model.gguf": SHA})
    p.full_clean()
    p.save()

    spec = protocol.ProfileSpec.model_validate(p.spec()["profile"])

    assert spec.model_path == "hf://org/tiny@v1"
    assert spec.weights_sha256 == {"sub/model.gguf": SHA}


def test_a_profile_without_checksums_keeps_the_hash_it_had():
    # Running replicas are rolled when the hash changes: an upgrade must not change it.
    p = profile(model_path="/models/tiny.gguf")
    before = p.spec_hash
    p.weights_sha256 = {"tiny.gguf": SHA}
    assert p.spec_hash != before
    p.weights_sha256 = {}
    assert p.spec_hash == before


def test_the_api_refuses_a_bad_source_and_takes_checksums(api):
    model = Model.objects.create(name="tiny")
    body = {**CPU, "model": model.pk, "model_path": "ftp://h/x.gguf"}
    resp = api.post("/api/v1/engine-profiles/", body, content_type="application/json")
    assert resp.status_code == 400
    assert "unknown scheme 'ftp://'" in resp.json()["model_path"][0]

    body.update(model_path="https://h.example/x.gguf", weights_sha256={"x.gguf": SHA})
    resp = api.post("/api/v1/engine-profiles/", body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["weights_sha256"] == {"x.gguf": SHA}
    assert EngineProfile.objects.get().weights_sha256 == {"x.gguf": SHA}


def test_apply_takes_checksums_and_reports_a_bad_source_by_field():
    ok = f"""
models:
  - name: tiny
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: https://h.example/x.gguf
        weights_sha256: {{x.gguf: {SHA}}}
"""
    catalog.apply(ok)
    assert EngineProfile.objects.get().weights_sha256 == {"x.gguf": SHA}

    bad = ok.replace("https://h.example/x.gguf", "hf://org")
    with pytest.raises(catalog.CatalogError) as err:
        catalog.apply(bad)
    assert err.value.errors == [
        "profile tiny/cpu.model_path: 'hf://org': "
        "a hub source is hf://org/name[/path/in/repo][@revision]"
    ]
    assert EngineProfile.objects.get().model_path == "https://h.example/x.gguf"


def test_the_same_source_gets_the_same_directory_name_everywhere():
    # A shared filesystem holds one copy: every node must find it under one name.
    a = sources.parse("hf://Qwen/Qwen2.5-0.5B@main")
    assert a.slug == sources.parse("hf://Qwen/Qwen2.5-0.5B@main").slug
    assert a.slug.startswith("hf--Qwen--Qwen2.5-0.5B--main-")
    assert a.slug != sources.parse("hf://Qwen/Qwen2.5-0.5B").slug  # spelt differently
    # a file of a repository has a name of its own, and the repository's stays as it was
    one = sources.parse("hf://Qwen/Qwen2.5-0.5B/q4/model.gguf@main")
    assert one.path == "q4/model.gguf" and one.repo == "Qwen/Qwen2.5-0.5B"
    assert one.slug.startswith("hf--Qwen--Qwen2.5-0.5B--q4--model.gguf--main-")
