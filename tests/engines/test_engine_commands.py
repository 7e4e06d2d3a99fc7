"""What each engine adapter runs for a shard: argv and environment, tables of cases."""

import sys

import pytest

from agentd import protocol, rpcrelay, rpcwait
from agentd.engines import EngineUnavailable, make_engines
from agentd.engines.base import metric_sum
from agentd.engines.llamacpp import LlamaCpp
from agentd.engines.sglang import SGLang
from agentd.engines.vllm import VLLM
from tests.engines.helpers import H100_UUIDS, profile, shard, stub_binary

LEADER = {"leader_addr": "10.0.0.11", "leader_port": 29500}


@pytest.fixture
def bins(tmp_path):
    """Stand-ins for the engines' CLIs: nothing real is started by these tests."""
    return {
        "vllm": stub_binary(tmp_path, "vllm", "echo 'INFO loading'; echo 0.11.0"),
        "llama-server": stub_binary(
            tmp_path,
            "llama-server",
            "echo 'version: 6520 (4f1c2b3a)' >&2; echo 'built with cc 12.2.0 for x86_64' >&2",
        ),
    }


VLLM_CASES = [
    (
        "one node, TP 2",
        dict(tp=2),
        dict(gpu_uuids=H100_UUIDS),
        ["serve", "/models/llama-70b", "--host", "0.0.0.0", "--port", "8001",
         "--served-model-name", "llama-70b", "--tensor-parallel-size", "2",
         "--pipeline-parallel-size", "1"],
    ),
    (
        "leader of two nodes",
        dict(tp=8, pp=2),
        dict(nnodes=2, rank=0, **LEADER),
        ["serve", "/models/llama-70b", "--host", "0.0.0.0", "--port", "8001",
         "--served-model-name", "llama-70b", "--tensor-parallel-size", "8",
         "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0",
         "--master-addr", "10.0.0.11", "--master-port", "29500"],
    ),
    (
        "follower of two nodes runs headless",
        dict(tp=8, pp=2),
        dict(nnodes=2, rank=1, **LEADER),
        ["serve", "/models/llama-70b", "--host", "0.0.0.0", "--port", "8001",
         "--served-model-name", "llama-70b", "--tensor-parallel-size", "8",
         "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
         "--master-addr", "10.0.0.11", "--master-port", "29500", "--headless"],
    ),
    (
        "a share of its GPU: vLLM's per-instance part of the GPU's total",
        dict(gpu_memory_gb=30),
        dict(gpu_uuids=H100_UUIDS[:1], gpu_memory_fraction=0.3678),
        ["serve", "/models/llama-70b", "--host", "0.0.0.0", "--port", "8001",
         "--served-model-name", "llama-70b", "--tensor-parallel-size", "1",
         "--pipeline-parallel-size", "1", "--gpu-memory-utilization", "0.3678"],
    ),
    (
        "LoRA adapters, loaded while it serves",
        dict(max_adapters=4),
        dict(),
        ["serve", "/models/llama-70b", "--host", "0.0.0.0", "--port", "8001",
         "--served-model-name", "llama-70b", "--tensor-parallel-size", "1",
         "--pipeline-parallel-size", "1", "--enable-lora", "--max-loras", "4"],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case, prof, spec, expected", VLLM_CASES, ids=[c[0] for c in VLLM_CASES])
def test_vllm_argv(bins, case, prof, spec, expected):
    p = profile("vllm", model_path="/models/llama-70b", **prof)
    s = shard(engine="vllm", profile=p, model="llama-70b", port=8001, **spec)
    launch = VLLM(bins["vllm"]).build(p, s, host="0.0.0.0", port=8001)
    assert launch.argv == [bins["vllm"], *expected]


SGLANG_CASES = [
    (
        "one node, TP 4",
        dict(tp=4),
        dict(),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "4", "--enable-metrics"],
    ),
    (
        "a share of its GPU: weights and KV cache within it",
        dict(gpu_memory_gb=20),
        dict(gpu_memory_fraction=0.2452),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "1", "--enable-metrics",
         "--mem-fraction-static", "0.2452"],
    ),
    (
        "pipeline parallel",
        dict(tp=4, pp=2),
        dict(),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "4", "--enable-metrics",
         "--pp-size", "2"],
    ),
    (
        "second of two nodes",
        dict(tp=16),
        dict(nnodes=2, rank=1, **LEADER),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "16", "--enable-metrics",
         "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.11:29500"],
    ),
    (
        "sleeps at level 1: the memory saver, the weights kept in host memory",
        dict(),
        dict(gpu_uuids=H100_UUIDS[:1], sleep_level=1),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "1", "--enable-metrics",
         "--enable-memory-saver", "--enable-weights-cpu-backup"],
    ),
    (
        "sleeps at level 2: the memory saver only, the weights dropped",
        dict(),
        dict(gpu_uuids=H100_UUIDS[:1], sleep_level=2),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "1", "--enable-metrics",
         "--enable-memory-saver"],
    ),
    (
        "no GPUs: nothing to release, it sleeps by stopping",
        dict(),
        dict(sleep_level=1),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "1", "--enable-metrics"],
    ),
    (
        "LoRA adapters, loaded while it serves",
        dict(max_adapters=2),
        dict(),
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port",
         "30000", "--served-model-name", "llama-8b", "--tp-size", "1", "--enable-metrics",
         "--enable-lora", "--max-loras-per-batch", "2", "--max-lora-rank", "16",
         "--lora-target-modules", "all"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, prof, spec, expected", SGLANG_CASES, ids=[c[0] for c in SGLANG_CASES]
)
def test_sglang_argv(case, prof, spec, expected):
    p = profile("sglang", served_model_name="llama-8b", **prof)
    s = shard(engine="sglang", profile=p, model="meta-llama/Llama-3.1-8B-Instruct", **spec)
    launch = SGLang(sys.executable).build(p, s, host="0.0.0.0", port=30000)
    assert launch.argv == [sys.executable, "-m", "sglang.launch_server", *expected]


SLEEP_CASES = [
    ("vLLM, level 1", VLLM, 1,
     [("/sleep?level=1&mode=wait", None)], [("/wake_up", None)]),
    ("vLLM, level 2: the weights read again before the KV cache returns", VLLM, 2,
     [("/sleep?level=2&mode=wait", None)],
     [("/wake_up?tags=weights", None), ("/collective_rpc", {"method": "reload_weights"}),
      ("/wake_up?tags=kv_cache", None)]),
    ("SGLang, level 1: every region released, the weights kept by the start flag", SGLang, 1,
     [("/release_memory_occupation", {})], [("/resume_memory_occupation", {})]),
    ("SGLang, level 2", SGLang, 2,
     [("/release_memory_occupation", {})],
     [("/resume_memory_occupation", {"tags": ["weights"]}),
      ("/update_weights_from_disk", {"model_path": "/models/llama-8b"}),
      ("/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})]),
]  # fmt: skip


def test_vllm_sleeps_in_place_on_gpus_only(bins):
    p = profile("vllm", model_path="/models/llama-8b")
    engine = VLLM(bins["vllm"])
    on_gpu = engine.build(p, shard(engine="vllm", profile=p, gpu_uuids=H100_UUIDS[:1],
                                   sleep_level=2), host="h", port=1)  # fmt: skip
    assert "--enable-sleep-mode" in on_gpu.argv
    assert on_gpu.env["VLLM_SERVER_DEV_MODE"] == "1"  # the sleep endpoints are dev endpoints
    # The CPU build refuses --enable-sleep-mode as it starts: a CPU shard sleeps by stopping.
    on_cpu = engine.build(p, shard(engine="vllm", profile=p, sleep_level=1), host="h", port=1)
    assert "--enable-sleep-mode" not in on_cpu.argv
    assert "VLLM_SERVER_DEV_MODE" not in on_cpu.env


def test_the_fake_sleeps_in_place_without_gpus_as_vllm_would_with_them():
    from agentd.engines.fake import FakeEngine

    p = profile("fake")
    engine = FakeEngine(sys.executable)
    launch = engine.build(p, shard(profile=p, sleep_level=2), host="h", port=1)
    assert "--enable-sleep-mode" in launch.argv
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert engine.wake_calls(shard(profile=p, sleep_level=2)) == VLLM().wake_calls(
        shard(engine="vllm", sleep_level=2)
    )
    awake = engine.build(p, shard(profile=p), host="h", port=1)  # a model that never sleeps
    assert "--enable-sleep-mode" not in awake.argv and "VLLM_SERVER_DEV_MODE" not in awake.env


@pytest.mark.parametrize(
    "case, kind, level, sleeps, wakes", SLEEP_CASES, ids=[c[0] for c in SLEEP_CASES]
)
def test_sleep_and_wake_calls(case, kind, level, sleeps, wakes):
    p = profile(kind.name, model_path="/models/llama-8b")
    s = shard(engine=kind.name, profile=p, gpu_uuids=H100_UUIDS[:1], sleep_level=level)
    engine = kind(sys.executable)
    assert engine.sleeps_in_place(s)
    assert [engine.sleep_call(level)] == sleeps
    assert engine.wake_calls(s) == wakes


def test_llama_server_argv_and_version(bins):
    engine = LlamaCpp(bins["llama-server"])
    p = profile("llamacpp", model_path="/w/tiny.gguf", args=["-c", "512"])
    launch = engine.build(p, shard(engine="llamacpp", profile=p), host="127.0.0.1", port=9000)
    assert launch.argv == [
        bins["llama-server"], "-m", "/w/tiny.gguf", "--host", "127.0.0.1", "--port", "9000",
        "--alias", "tiny-llama", "--metrics", "-c", "512",
    ]  # fmt: skip
    assert engine.version() == "6520 (4f1c2b3a)"
    assert engine.health_path == "/health"  # 503 while loading
    assert "llamacpp:requests_processing" in engine.in_flight_series


def test_llama_cpp_python_argv():
    engine = LlamaCpp(sys.executable)  # a Python interpreter: llama-cpp-python's server
    p = profile("llamacpp", model_path="/w/tiny.gguf", served_model_name="tiny")
    launch = engine.build(p, shard(engine="llamacpp", profile=p), host="127.0.0.1", port=9000)
    assert launch.argv == [
        sys.executable, "-m", "llama_cpp.server", "--model", "/w/tiny.gguf", "--host",
        "127.0.0.1", "--port", "9000", "--model_alias", "tiny", "--interrupt_requests", "false",
    ]  # fmt: skip
    # It has no /health and no request gauge: readiness from /v1/models, drain bounded by time.
    assert engine.health_path == "/v1/models"
    assert engine.in_flight_series == ()


ENV_CASES = [
    (
        "GPUs by UUID; placement beats the profile's CUDA_VISIBLE_DEVICES",
        dict(env={"CUDA_VISIBLE_DEVICES": "0", "VLLM_USE_V1": "1"}),
        dict(gpu_uuids=H100_UUIDS),
        {"CUDA_VISIBLE_DEVICES": ",".join(H100_UUIDS), "VLLM_USE_V1": "1"},
    ),
    (
        "a shard without GPUs sees none",
        dict(),
        dict(),
        {"CUDA_VISIBLE_DEVICES": ""},
    ),
    (
        "multi-node: exact HCA names and the management interface",
        dict(),
        dict(nnodes=2, hcas=["mlx5_0", "mlx5_1"], mgmt_interface="eno1", **LEADER),
        {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "=eno1",
         "GLOO_SOCKET_IFNAME": "eno1"},
    ),
    (
        "an operator's interface in the profile wins",
        dict(env={"NCCL_SOCKET_IFNAME": "bond"}),
        dict(nnodes=2, mgmt_interface="eno1", **LEADER),
        {"NCCL_SOCKET_IFNAME": "bond", "GLOO_SOCKET_IFNAME": "eno1"},
    ),
    (
        "an operator's NCCL setting in the profile wins",
        dict(env={"NCCL_IB_HCA": "^mlx5_3"}),
        dict(hcas=["mlx5_0"]),
        {"NCCL_IB_HCA": "^mlx5_3"},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case, prof, spec, expected", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_environment(bins, case, prof, spec, expected):
    p = profile("vllm", **prof)
    launch = VLLM(bins["vllm"]).build(p, shard(engine="vllm", profile=p, **spec), host="h", port=1)
    for key, value in expected.items():
        assert launch.env[key] == value, key
    if "hcas" not in spec and "NCCL_IB_HCA" not in prof.get("env", {}):
        assert "NCCL_IB_HCA" not in launch.env


def test_sglang_gets_the_same_multi_node_environment(bins):
    p = profile("sglang", tp=8)
    spec = shard(
        engine="sglang", profile=p, nnodes=2, rank=1, hcas=["mlx5_0"], mgmt_interface="eno1",
        fabric="ib0", **LEADER,
    )  # fmt: skip
    engine = SGLang(bins["vllm"])  # any executable: nothing is started
    launch = engine.build(p, spec, host="h", port=1)
    assert launch.env["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert launch.env["GLOO_SOCKET_IFNAME"] == "eno1"
    assert launch.env["NCCL_IB_HCA"] == "=mlx5_0"
    assert "--dist-init-addr" in launch.argv and "10.0.0.11:29500" in launch.argv


def test_profile_args_come_last_so_they_win(bins):
    p = profile("vllm", args=["--port", "9999", "--max-model-len", "8192"])
    argv = VLLM(bins["vllm"]).build(p, shard(engine="vllm", profile=p), host="h", port=8001).argv
    assert argv[-4:] == ["--port", "9999", "--max-model-len", "8192"]


def test_vllm_version_is_the_last_line(bins):
    assert VLLM(bins["vllm"]).version() == "0.11.0"


@pytest.mark.parametrize("engine", [VLLM("/nonexistent/vllm"), SGLang("/nonexistent/python3")])
def test_a_missing_binary_says_which(engine):
    with pytest.raises(EngineUnavailable, match="/nonexistent/"):
        engine.version()
    with pytest.raises(EngineUnavailable, match="/nonexistent/"):
        engine.command()


def test_sglang_version_needs_sglang_in_that_python():
    with pytest.raises(EngineUnavailable, match="sglang is not installed for"):
        SGLang(sys.executable).version()


def test_registry_fake_is_opt_in_and_names_are_checked():
    assert sorted(make_engines()) == ["llamacpp", "sglang", "vllm"]
    assert "fake" in make_engines({"fake": sys.executable})
    with pytest.raises(ValueError, match="unknown engine 'vlm'"):
        make_engines({"vlm": "/usr/bin/vllm"})


METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-70b"} 3.0
vllm:num_requests_waiting{model_name="llama-70b"} 2.0 1718000000000
vllm:num_requests_running_total 99
llamacpp:requests_processing 1
"""


@pytest.mark.parametrize(
    "names, expected",
    [
        (("vllm:num_requests_running", "vllm:num_requests_waiting"), 5),
        (("llamacpp:requests_processing",), 1),
        (("sglang:num_running_reqs",), None),  # absent is not zero
    ],
)
def test_in_flight_from_metrics(names, expected):
    assert metric_sum(METRICS, names) == expected


def test_llama_cpp_sharing_a_gpu_is_told_the_layers_its_budget_holds(bins):
    p = profile("llamacpp", model_path="/w/tiny.gguf", gpu_memory_gb=4)
    s = shard(engine="llamacpp", profile=p, gpu_uuids=H100_UUIDS[:1], gpu_layers=17)
    server = LlamaCpp(bins["llama-server"]).build(p, s, host="127.0.0.1", port=9000)
    python = LlamaCpp(sys.executable).build(p, s, host="127.0.0.1", port=9000)
    assert server.argv[-2:] == ["--n-gpu-layers", "17"]  # llama-server's flag
    assert python.argv[-2:] == ["--n_gpu_layers", "17"]  # llama_cpp.server's setting
    # not told (whole GPUs, or no estimate): llama.cpp's own default stands
    whole = shard(engine="llamacpp", profile=p, gpu_uuids=H100_UUIDS[:1])
    built = LlamaCpp(bins["llama-server"]).build(p, whole, host="127.0.0.1", port=9000)
    assert "--n-gpu-layers" not in built.argv


RPC = ["10.0.0.12:50052", "[fd00::13]:50053"]


def test_llama_cpp_over_three_nodes_leader_waits_for_its_rpc_servers_then_offloads_to_them(
    tmp_path, bins
):
    # The install's environment: its Python, with llama-server and ggml-rpc-server beside it.
    python = stub_binary(tmp_path, "python3", "exit 0")
    rpc = stub_binary(tmp_path, "ggml-rpc-server", "exit 0")
    engine = LlamaCpp(python)
    p = profile("llamacpp", model_path="/w/tiny.gguf", nodes=3, args=["-c", "512"])
    leader = engine.build(
        p, shard(engine="llamacpp", profile=p, nnodes=3, rank=0, rpc_servers=RPC),
        host="0.0.0.0", port=9000,
    )  # fmt: skip
    assert leader.argv == [
        sys.executable, rpcwait.__file__, "--timeout", "1800", *RPC, "--",
        str(tmp_path / "llama-server"), "-m", "/w/tiny.gguf",
        "--host", "0.0.0.0", "--port", "9000", "--alias", "tiny-llama", "--metrics",
        "--rpc", ",".join(RPC), "--n-gpu-layers", "all", "-c", "512",
    ]  # fmt: skip
    # Each follower's rpc-server listens on loopback (it has no auth), behind a relay on
    # the address the leader connects to that lets the leader's address through only.
    second = engine.build(
        p, shard(engine="llamacpp", profile=p, nnodes=3, rank=2, rpc_servers=RPC,
                 leader_addr="10.0.0.11"),
        host="0.0.0.0", port=50053,
    )  # fmt: skip
    assert second.argv == [
        sys.executable, rpcrelay.__file__, "--host", "fd00::13", "--port", "50053",
        "--allow", "10.0.0.11", "--ready-timeout", "1800", "--",
        rpc, "-H", "127.0.0.1", "-p", "{port}",
    ]  # fmt: skip
    # and without the leader's address there is nobody to let through: it does not start
    with pytest.raises(EngineUnavailable, match="sent no leader address"):
        engine.build(p, shard(engine="llamacpp", profile=p, nnodes=3, rank=1, rpc_servers=RPC),
                     host="0.0.0.0", port=50052)  # fmt: skip


def test_llama_cpp_over_nodes_without_the_rpc_tools_or_their_addresses_says_what_is_missing(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", str(tmp_path))  # none on PATH, none beside the Python
    engine = LlamaCpp(stub_binary(tmp_path, "python3", "exit 0"))
    p = profile("llamacpp", model_path="/w/tiny.gguf", nodes=2)
    with pytest.raises(EngineUnavailable, match="needs ggml-rpc-server built with RPC"):
        engine.build(
            p, shard(engine="llamacpp", profile=p, nnodes=2, rank=1, rpc_servers=RPC[:1]),
            host="0.0.0.0", port=1,
        )  # fmt: skip
    with pytest.raises(EngineUnavailable, match="needs 1 rpc-server addresses; .* sent 0"):
        engine.build(p, shard(engine="llamacpp", profile=p, nnodes=2), host="0.0.0.0", port=1)


def test_vllm_with_adapters_may_load_them_at_runtime(bins):
    p = profile("vllm", model_path="/models/llama-70b", max_adapters=2)
    env = VLLM(bins["vllm"]).build(p, shard(engine="vllm", profile=p), host="h", port=1).env
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = profile("vllm", model_path="/models/llama-70b")
    env = VLLM(bins["vllm"]).build(plain, shard(engine="vllm", profile=plain), host="h", port=1)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env.env


def test_llama_cpp_with_adapters_runs_llama_server_with_each_adapter_numbered(tmp_path):
    # llama-cpp-python's server cannot apply adapters per request: llama-server beside it does
    python = tmp_path / "env" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    server = stub_binary(python.parent, "llama-server", "true")
    p = profile("llamacpp", model_path="/w/tiny.gguf", max_adapters=2, args=["-c", "512"])
    local = [
        protocol.AdapterSpec(name="pirate", source="/w/pirate.gguf"),
        protocol.AdapterSpec(name="poet", source="/w/poet.gguf"),
    ]
    s = shard(engine="llamacpp", profile=p, adapters=local)
    launch = LlamaCpp(str(python)).build(p, s, host="127.0.0.1", port=9000)
    assert launch.argv == [
        server, "-m", "/w/tiny.gguf", "--host", "127.0.0.1", "--port", "9000",
        "--alias", "tiny-llama", "--metrics", "--lora", "/w/pirate.gguf,/w/poet.gguf",
        "--lora-init-without-apply", "-c", "512",
    ]  # fmt: skip


def test_vllms_cpu_build_runs_its_api_server_module_with_a_kv_budget_and_the_nodes_cores(
    tmp_path,
):
    from agentd.engines.vllm import cpu_binding

    python = stub_binary(tmp_path, "python3", "echo 0.32.0")
    p = profile("vllm", model_path="/models/tiny-hf", args=["--dtype", "bfloat16"])
    engine = VLLM(python)
    # given: a shard placed on a CPU node (no GPUs), told its KV cache's size
    launch = engine.build(p, shard(engine="vllm", profile=p, kv_cache_gb=3), host="h", port=8001)
    # then: the CPU build's module, --model rather than `serve` (its vllm command fails)
    assert launch.argv[:6] == [python, "-m", "vllm.entrypoints.openai.api_server",
                               "--model", "/models/tiny-hf", "--host"]  # fmt: skip
    assert launch.argv[-2:] == ["--dtype", "bfloat16"]
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_binding(1)
    assert engine.version() == "0.32.0"
    # a shard told no size gets vLLM's documented 4 GiB, not 92 % of the machine
    launch = engine.build(p, shard(engine="vllm", profile=p), host="h", port=8001)
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    # and a profile's own values win over both
    mine = {"VLLM_CPU_KVCACHE_SPACE": "9", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    own = profile("vllm", model_path="/m", env=mine)
    env = engine.build(own, shard(engine="vllm", profile=own, kv_cache_gb=3), host="h", port=1).env
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_CPU_OMP_THREADS_BIND"]) == ("9", "nobind")
    # a GPU shard is told neither
    env = VLLM("vllm").env(p, shard(engine="vllm", profile=p, gpu_uuids=H100_UUIDS))
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env


@pytest.mark.parametrize(
    "ranks, cpus, expected",
    [
        (1, {0, 1}, "0-1"),
        (2, set(range(8)), "0-3|4-7"),
        (3, set(range(8)), "0-1|2-3|4-7"),
        (2, {0, 2, 3, 5}, "0,2|3,5"),
        (3, {0, 1}, "0-1|0-1|0-1"),
    ],
)
def test_vllm_cpu_threads_split_the_cores_between_ranks(ranks, cpus, expected):
    from agentd.engines.vllm import cpu_binding

    assert cpu_binding(ranks, cpus) == expected
