"""What the commands share: where models are found, the engine and store the flags name, argument groups."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gatehead import demo
from gatehead.cli.settings import AGENT, MODEL, add_settings
from gatehead.retrieval.config import StoreConfig


def model_locations() -> dict[str, object]:
    """Where gatehead looks for the base model and gate adapter, in order of precedence."""
    from gatehead.demo import base

    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return {
        "model": os.environ.get("GATEHEAD_MODEL") or str(demo.MODEL_DIR),
        "adapter": os.environ.get("GATEHEAD_ADAPTER") or str(demo.DEFAULT_ADAPTER_DIR),
        "from_env": {name: os.environ.get(name) for name in ("GATEHEAD_MODEL", "GATEHEAD_ADAPTER")},
        "demo_model": {"path": str(demo.MODEL_DIR), "provenance": base.provenance(demo.MODEL_DIR)},
        "pretrained_base": {"path": str(base.base_dir()), "provenance": base.provenance(base.base_dir())},
        "hf_cache": str(hf_home / "hub"),
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"),
    }


def chosen_model(given: str | Path | None) -> str:
    """The model a command runs: the one given, else `GATEHEAD_MODEL`, else the demo model. The demo model
    is built on first use (the registry's base converted and the committed generator merged, both checked;
    reused after)."""
    model = str(given or os.environ.get("GATEHEAD_MODEL") or demo.MODEL_DIR)
    if Path(model).resolve() == demo.MODEL_DIR.resolve() and not (demo.MODEL_DIR / "config.json").exists():
        from gatehead.demo.base import ensure_demo_model

        ensure_demo_model()
    return model


def thresholds(args: argparse.Namespace):
    from gatehead.gate.policy import Thresholds

    given = {k: v for k, v in (("answer", args.t_answer), ("refuse", args.t_refuse)) if v is not None}
    return Thresholds.from_dict(given) if given else None


def vllm_urls(args: argparse.Namespace) -> tuple[str, ...]:
    """The servers `--vllm-url` names (comma-separated), or none."""
    return tuple(u.strip() for u in (getattr(args, "vllm_url", None) or "").split(",") if u.strip())


def agent_thresholds(args: argparse.Namespace):
    """The agent's gate thresholds: `--t-answer`/`--t-refuse` over the adapter's calibrated ones; None where
    neither is given (the agent then takes the adapter's)."""
    import json

    from gatehead.gate.adapter import GATE_JSON
    from gatehead.gate.policy import Thresholds

    given = {k: v for k, v in (("answer", args.t_answer), ("refuse", args.t_refuse)) if v is not None}
    if not given:
        return None
    adapter = Path(args.adapter or model_locations()["adapter"])
    calibrated = json.loads((adapter / GATE_JSON).read_text())["thresholds"]
    return Thresholds.from_dict({**calibrated, **given})


def start_engine(args: argparse.Namespace, gate: bool = True):
    """A shared engine on the chosen (or default) model and adapter, eager, with a small KV pool; or, with
    `--vllm-url`, a `RemoteEngine` on those servers."""
    from gatehead.runtime.engine import EngineConfig, SharedEngine

    locations = model_locations()
    if vllm_urls(args):
        from gatehead.runtime.remote import RemoteConfig, RemoteEngine

        return RemoteEngine(RemoteConfig(urls=vllm_urls(args), model=chosen_model(args.model),
                                         adapter=args.adapter or locations["adapter"],
                                         api_key=os.environ.get("VLLM_API_KEY")))
    return SharedEngine(EngineConfig(model=chosen_model(args.model),
                                     adapter=(args.adapter or locations["adapter"]) if gate else None,
                                     enforce_eager=not args.compile, kv_cache_memory_bytes=args.kv_mb << 20,
                                     max_model_len=args.max_model_len, dtype=args.dtype))


def store_config(args: argparse.Namespace) -> StoreConfig | None:
    """The store the agent commands use; None for the demo index (built on first use)."""
    if args.url and args.store:  # possible through the environment (GATEHEAD_URL and GATEHEAD_STORE)
        raise ValueError("give a store directory or a Qdrant URL, not both")
    if args.url:
        return StoreConfig(url=args.url, api_key=os.environ.get("QDRANT_API_KEY"),
                           collection=args.collection or StoreConfig.collection)
    if args.store:
        return StoreConfig(path=args.store, collection=args.collection or StoreConfig.collection)
    return None


def agent_store(args: argparse.Namespace) -> tuple[StoreConfig, tuple[Path, ...]]:
    """(the store the agent reads, what to ingest into it first): the one the flags name, or the demo index
    with the demo corpus."""
    given = store_config(args)
    if given is not None:
        return given, ()
    from gatehead.demo.index import CORPUS, demo_store_config

    return demo_store_config(), (CORPUS,)


def base_model_name(model: str | Path) -> str | None:
    """The plain-generation model's id: `gatehead-demo` for the demo model, else the directory's name."""
    from gatehead.demo import MODEL_DIR

    return "gatehead-demo" if Path(model).resolve() == MODEL_DIR.resolve() else None


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    add_settings(p, MODEL)


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    add_settings(p, MODEL + AGENT)
