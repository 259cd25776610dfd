"""The "tencache" block: defaults, units, and errors that name the key."""
import pytest

from tencache_ds.config import TencacheConfig, config_of_ds_dict, parse_config
from tencache_ds.errors import TencacheConfigError
from tencache_ds.plan.budget import UNLIMITED, MachineResources, resolve_budgets
from tencache_ds.units import fmt_bytes, parse_bytes, round_up


def test_defaults_need_no_tuning():
    config = parse_config({})
    assert config.enabled and config.host_cache_bytes == "auto" and config.device_cache_bytes == "auto"
    assert config.metrics_path is None and config.profile_path is None


def test_absent_block_means_disabled_and_bool_shorthand():
    assert parse_config(None).enabled is False
    assert parse_config(False).enabled is False
    assert parse_config(True).enabled is True


@pytest.mark.parametrize("value, expected", [(0, 0), ("0", 0), ("1GiB", 1 << 30), ("512MB", 512 * 10**6),
                                             (1e9, 10**9), ("2e9", 2 * 10**9), ("auto", "auto")])
def test_budget_units(value, expected):
    assert parse_config({"host_cache_bytes": value}).host_cache_bytes == expected


@pytest.mark.parametrize("block, key", [({"host_cache": 1}, "tencache.host_cache"),
                                        ({"host_cache_bytes": "lots"}, "tencache.host_cache_bytes"),
                                        ({"host_cache_bytes": -5}, "tencache.host_cache_bytes"),
                                        ({"device_cache_bytes": True}, "tencache.device_cache_bytes"),
                                        ({"pin_memory": "sometimes"}, "tencache.pin_memory"),
                                        ({"enabled": "maybe"}, "tencache.enabled")])
def test_bad_input_names_the_key(block, key):
    with pytest.raises(TencacheConfigError) as err:
        parse_config(block)
    assert key in str(err.value)


def test_block_must_be_an_object():
    with pytest.raises(TencacheConfigError, match="must be an object"):
        parse_config([1, 2])


def test_the_block_of_a_ds_config_dict():
    """config_of_ds_dict finds the block at the top level and parses it; no block or no dict is a disabled block."""
    config = config_of_ds_dict({"train_batch_size": 1, "tencache": {"host_cache_bytes": 0}})
    assert config.enabled and config.host_cache_bytes == 0
    assert config_of_ds_dict({"train_batch_size": 1}) == TencacheConfig(enabled=False)
    assert config_of_ds_dict(None) == TencacheConfig(enabled=False)
    assert not config_of_ds_dict({"tencache": False}).enabled
    with pytest.raises(TencacheConfigError, match="tencache.host_cach: unknown key"):
        config_of_ds_dict({"tencache": {"host_cach": 0}})
    # a key that begins as pydantic's union branches do keeps its name ("tencache.: unknown key" until 2026-12-02)
    with pytest.raises(TencacheConfigError, match="tencache.intra_op_parallelism: unknown key"):
        config_of_ds_dict({"tencache": {"intra_op_parallelism": 4}})
    with pytest.raises(TencacheConfigError, match=r"tencache.host_cache_bytes: .*\(got 'lots'\)"):
        config_of_ds_dict({"tencache": {"host_cache_bytes": "lots"}})


def test_units():
    assert parse_bytes("1.5KiB") == 1536
    assert fmt_bytes(1536) == "1.50 KiB"
    assert round_up(5000) == 8192 and round_up(4096) == 4096
    with pytest.raises(ValueError):
        parse_bytes("1.5")  # not a whole number of bytes
    # read exactly: in binary floating point 4.1 x 10^9 is 4099999999.9999995, refused as no whole number until
    # 2026-12-02, while "1.5GB" passed
    assert parse_bytes("4.1GB") == 4_100_000_000 and parse_bytes("8.2GB") == 8_200_000_000
    assert parse_bytes("2e9") == 2_000_000_000 and parse_bytes("0.5KiB") == 512
    for bad in ("1e400", "1e999999999", "1e-999999999", "9.3e18", float("inf"), float("nan"), "0.1",
                "1.0000000001KB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_auto_budgets_follow_the_machine():
    machine = MachineResources(host_total_bytes=32 << 30, host_available_bytes=16 << 30,
                               memlock_limit_bytes=UNLIMITED, device_free_bytes=8 << 30)
    budgets = resolve_budgets(TencacheConfig(), machine, stream_min_bytes=0, locks_memory=True)
    assert budgets.host_cache_bytes == 4 << 30 and budgets.device_cache_bytes == 4 << 30
    assert budgets.host_source == "auto"
    # a memlock limit caps what "auto" may lock, after what streaming already locks
    limited = MachineResources(32 << 30, 16 << 30, memlock_limit_bytes=1 << 30)
    assert resolve_budgets(TencacheConfig(), limited, stream_min_bytes=256 << 20,
                           locks_memory=True).host_cache_bytes == 768 << 20
    explicit = resolve_budgets(TencacheConfig(host_cache_bytes=0, device_cache_bytes=0), machine, stream_min_bytes=0,
                               locks_memory=True)
    assert (explicit.host_cache_bytes, explicit.device_cache_bytes, explicit.host_source) == (0, 0, "config")


def test_configuration_reference_is_current():
    import os
    from tencache_ds.config import config_reference_markdown
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "configuration.md")
    with open(path) as handle:
        assert handle.read() == config_reference_markdown(), \
            "docs/configuration.md is stale: tencache-ds config-reference > docs/configuration.md"
