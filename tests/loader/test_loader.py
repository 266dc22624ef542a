"""Image selection on fabricated images with a faked driver and devices: every accept and reject path."""

from __future__ import annotations

import json
import threading
import warnings

import pytest

from astrai.extension import loader

H200 = (9, 0)
B200 = (10, 0)
B300 = (10, 3)
RTX_PRO = (12, 0)
A100 = (8, 0)
L40 = (8, 9)
A10 = (8, 6)
T4 = (7, 5)


# --- arch rules -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch, capability, runs", [
    ("sm_90a", (9, 0), True),     # `a`: exactly X.Y
    ("sm_90a", (10, 0), False),
    ("sm_100a", (10, 3), False),
    ("sm_100f", (10, 0), True),   # `f`: major X, minor >= Y
    ("sm_100f", (10, 3), True),
    ("sm_103f", (10, 0), False),
    ("sm_100f", (12, 0), False),
    ("sm_80", (8, 0), True),      # plain: major X, minor >= Y
    ("sm_80", (8, 6), True),
    ("sm_86", (8, 0), False),
    ("sm_80", (9, 0), False),
    ("sm_120", (12, 1), True),
    ("compute_80", (8, 0), True),  # plain PTX: any capability >= X.Y
    ("compute_80", (12, 1), True),
    ("compute_80", (7, 5), False),
    ("compute_90a", (9, 0), True),  # `a` PTX: exactly X.Y
    ("compute_90a", (10, 0), False),
])
def test_arch_rules(arch, capability, runs):
    assert loader.parse_arch(arch).runs_on(*capability) is runs


@pytest.mark.parametrize("text", ["sm90", "sm_9", "sm_90x", "lto_90", "", "compute_"])
def test_unrecognised_arch_is_ignored(text):
    assert loader.parse_arch(text) is None


@pytest.mark.parametrize("sass, capability, serves", [
    (["sm_90a"], H200, "sass"),
    (["sm_80"], A10, "sass"),         # plain SASS runs on a higher minor of its major
    (["sm_100f"], B300, "sass"),      # family SASS
    (["sm_86"], A100, None),          # plain SASS never runs on a lower minor
    (["sm_90a"], B200, None),         # `a` SASS never runs on another capability
    (["sm_120a"], (12, 1), None),
])
def test_sass_eligibility(fake, sass, capability, serves):
    fake.gpu(capability)
    fake.image("cu130", sass=sass, ptx=[])
    sel = fake.select()
    record = fake.record("cu130")
    assert record.serves == serves
    if serves:
        assert sel.chosen is record
    else:
        assert record.status == "rejected"
        assert f"no SASS for sm_{capability[0]}{capability[1]}" in record.reason
        assert "no PTX it can JIT" in record.reason


# --- PTX and the driver ---------------------------------------------------------------------------------


def test_ptx_jit_accepted_and_warns_once(fake):
    fake.gpu(B200)
    fake.image("cu130")  # sm_80 sm_89 sm_90a sm_120a + compute_80: Blackwell runs the PTX
    sel = fake.select()
    assert sel.chosen.name == "cu130"
    assert sel.chosen.serves == "ptx"
    assert "compute_80" in sel.why
    with pytest.warns(loader.PTXJITWarning, match="driver's JIT"):
        loader.load_family("rotary")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.load_family("rotary")  # loaded already: no second warning, no second load
    assert len(fake.loads) == 1


def test_ptx_too_new_for_the_driver(fake):
    fake.gpu(B300, driver=13000)
    fake.image("cu131", cuda="13.1.80")
    sel = fake.select()
    assert sel.chosen is None
    record = fake.record("cu131")
    assert record.status == "rejected"
    assert "too new for the driver" in record.reason
    assert "CUDA >= 13.1" in record.reason and "supports 13.0" in record.reason


def test_sass_needs_only_the_driver_major(fake):
    fake.gpu(H200, driver=13000)
    fake.image("cu131", cuda="13.1.80")
    assert fake.select().chosen.name == "cu131"


def test_driver_too_old_for_the_image_major(fake):
    fake.gpu(H200, driver=12080)
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93")
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    assert "driver too old for the image" in fake.record("cu130").reason
    assert "CUDA 13.x driver" in fake.record("cu130").reason


def test_ptx_a_variant_runs_only_on_its_capability(fake):
    fake.gpu(B200)
    fake.image("cu130", sass=["sm_80"], ptx=["compute_90a"])
    assert fake.select().chosen is None
    fake.gpu(H200)
    assert fake.select().chosen.serves == "ptx"


# --- broken images --------------------------------------------------------------------------------------


def test_sha256_mismatch_falls_back_to_the_next_image(fake):
    fake.gpu(H200)
    fake.image("cu130", bad_sha=("rotary",))
    fake.image("cu128", cuda="12.8.93")
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    assert "sha256 mismatch for astrai_rotary.so" in fake.record("cu130").reason
    loader.load_family("rotary")
    assert fake.loads == [str(fake.root / "cu128" / "astrai_rotary.so")]


def test_missing_library_file_rejects_the_image(fake):
    fake.gpu(H200)
    fake.image("cu130", families=("rotary", "attention"), missing=("attention",))
    fake.image("cu128", cuda="12.8.93", families=("rotary", "attention"))
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    assert "astrai_attention.so (family 'attention') is missing" in fake.record("cu130").reason


def test_truncated_library_rejects_the_image(fake):
    fake.gpu(H200)
    image = fake.image("cu130")
    (image / "astrai_rotary.so").write_bytes(b"short")
    assert fake.select().chosen is None
    assert "truncated or replaced" in fake.record("cu130").reason


def test_missing_family_keeps_the_image_for_other_families(fake):
    fake.gpu(H200)
    fake.image("cu130", families=("rotary",))
    fake.image("cu128", cuda="12.8.93", families=("rotary", "attention"))
    assert fake.select().chosen.name == "cu130"
    loader.load_family("rotary")
    assert loader.family_available("rotary")
    with pytest.raises(loader.FamilyUnavailableError) as info:
        loader.load_family("attention")
    message = str(info.value)
    assert "the chosen image cu130 has no 'attention' library (it has: rotary)" in message
    assert "images that have it: cu128" in message
    assert not loader.family_available("attention")


@pytest.mark.parametrize("raw, reason", [
    ("{not json", "malformed image.json"),
    ("[1, 2]", "top level is not an object"),
    ('{"schema_version": 1, "cuda_major": 13, "cuda_minor": 0}', "'libraries' is missing"),
    ('{"schema_version": "1", "cuda_major": 13, "cuda_minor": 0, "libraries": {}}', "schema_version is '1'"),
    ('{"schema_version": 1, "cuda_minor": 0, "libraries": {}}', "cuda_major is None"),
    ('{"schema_version": 1, "cuda_major": 13, "cuda_minor": 0, "libraries": {}}', "lists no libraries"),
    ('{"schema_version": 1, "cuda_major": 13, "cuda_minor": 0, "libraries": {"rotary": '
     '{"file": "../x.so", "sha256": "' + "0" * 64 + '", "sass": [], "ptx": []}}}', "file is '../x.so'"),
    ('{"schema_version": 1, "cuda_major": 13, "cuda_minor": 0, "libraries": {"rotary": '
     '{"file": "a.so", "sha256": "abc", "sass": [], "ptx": []}}}', "expected 64 hex digits"),
    ('{"schema_version": 1, "cuda_major": 13, "cuda_minor": 0, "libraries": {"rotary": '
     '{"file": "a.so", "sha256": "' + "0" * 64 + '", "sass": "sm_90a", "ptx": []}}}', "sass is 'sm_90a'"),
])
def test_malformed_image_json_is_rejected_and_others_serve(fake, raw, reason):
    fake.gpu(H200)
    fake.image("cu130", raw=raw)
    fake.image("cu128", cuda="12.8.93")
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    record = fake.record("cu130")
    assert record.status == "rejected"
    assert reason in record.reason


def test_newer_schema_version_is_rejected(fake):
    fake.gpu(H200)
    fake.image("cu140", cuda="14.0.10", schema_version=loader.SCHEMA_VERSION + 1)
    fake.image("cu130")
    assert fake.select().chosen.name == "cu130"
    assert "newer than this loader reads" in fake.record("cu140").reason


# --- ASTRAI_IMAGE ---------------------------------------------------------------------------------------


def test_forced_image_wins_over_preference(fake):
    fake.gpu(H200)
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93", sass=[], ptx=["compute_80"])  # PTX-only: the sm_80 path on Hopper
    fake.force("cu128")
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    assert sel.why.startswith("forced by ASTRAI_IMAGE=cu128")
    assert fake.record("cu130").reason == "not considered: ASTRAI_IMAGE=cu128 is in force"
    with pytest.warns(loader.PTXJITWarning):
        loader.load_family("rotary")
    assert fake.loads == [str(fake.root / "cu128" / "astrai_rotary.so")]


def test_forced_missing_image_raises_on_first_use(fake):
    fake.gpu(H200)
    fake.image("cu130")
    fake.force("cu999")
    sel = fake.select()  # selection itself never raises
    assert sel.chosen is None
    assert not loader.family_available("rotary")
    with pytest.raises(loader.FamilyUnavailableError) as info:
        loader.load_family("rotary")
    message = str(info.value)
    assert "ASTRAI_IMAGE=cu999: no image named 'cu999'" in message
    assert "images found: cu130" in message
    assert "ASTRAI_IMAGE=cu999" in message.splitlines()[-2]
    assert fake.loads == []


def test_forced_unusable_image_raises_with_the_reason(fake):
    fake.gpu(H200, driver=12080)
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93")
    fake.force("cu130")
    assert fake.select().chosen is None  # strict: no fallback to cu128
    with pytest.raises(loader.FamilyUnavailableError, match="ASTRAI_IMAGE=cu130 cannot be used: .*driver too old"):
        loader.load_family("rotary")


def test_forced_image_with_bad_checksum_raises(fake):
    fake.gpu(H200)
    fake.image("cu130", bad_sha=("rotary",))
    fake.force("cu130")
    with pytest.raises(loader.FamilyUnavailableError, match="sha256 mismatch"):
        loader.load_family("rotary")


# --- roots ----------------------------------------------------------------------------------------------


def test_image_path_with_missing_and_odd_entries(fake, tmp_path):
    fake.gpu(H200)
    single = tmp_path / "single"
    single.mkdir()
    image = fake.image("cu130", root=single)  # an entry that is itself an image directory
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    fake.set_path(tmp_path / "nope", not_a_dir, "", image, fake.root)
    sel = fake.select()
    statuses = [(r.source, r.status) for r in sel.roots]
    assert statuses == [("ASTRAI_IMAGE_PATH", "missing"), ("ASTRAI_IMAGE_PATH", "unreadable"),
                        ("ASTRAI_IMAGE_PATH", "scanned"), ("ASTRAI_IMAGE_PATH", "scanned"),
                        ("package", "ignored"), ("CONDA_PREFIX", "unset")]
    assert sel.roots[0].note == "does not exist"
    assert sel.roots[1].note == "is not a directory"
    assert sel.chosen.path == image
    assert sel.roots[3].note == "no image directories"


def test_conda_prefix_root_and_duplicates(fake, tmp_path, monkeypatch):
    fake.gpu(H200)
    conda_root = tmp_path / "conda" / "lib" / "astrai-kernels"
    fake.image("cu130", root=conda_root)
    (conda_root / "not-an-image").mkdir()
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path / "conda"))
    fake.set_path(conda_root)
    sel = fake.select()
    assert sel.roots[-1].source == "CONDA_PREFIX"
    assert sel.roots[-1].status == "duplicate"
    assert sel.roots[0].note == "skipped (no image.json): not-an-image"
    assert [r.name for r in sel.images] == ["cu130"]
    fake.set_path()
    sel = fake.select()
    assert sel.chosen.source == "CONDA_PREFIX"
    assert sel.overrides["CONDA_PREFIX"] == str(tmp_path / "conda")


def test_ignore_package_images_knob(fake, monkeypatch):
    monkeypatch.setenv(loader.ENV_IGNORE_PACKAGE_IMAGES, "0")
    sel = fake.select()
    package = [r for r in sel.roots if r.source == "package"][0]
    assert package.path == loader.PACKAGE_LIB_DIR
    assert package.status != "ignored"


# --- preference -----------------------------------------------------------------------------------------


def test_sass_preferred_over_ptx(fake):
    fake.gpu(B200)
    fake.image("cu130")  # PTX only for sm_100
    fake.image("cu128", cuda="12.8.93", sass=["sm_100a"], ptx=[])
    sel = fake.select()
    assert sel.chosen.name == "cu128"
    assert "SASS for every visible device" in sel.why
    assert fake.record("cu130").status == "eligible"
    assert "cu128 has SASS for every visible device, cu130 needs the PTX JIT" in fake.record("cu130").reason


@pytest.mark.parametrize("torch_cuda, expected", [("12.8", "cu128"), ("13.0", "cu130"), (None, "cu130")])
def test_toolkit_major_matching_torch_preferred(fake, torch_cuda, expected):
    fake.gpu(H200)
    fake.torch_cuda = torch_cuda
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93")
    sel = fake.select()
    assert sel.chosen.name == expected
    if torch_cuda == "12.8":
        assert "matches torch's CUDA 12.8" in fake.record("cu128").reason
        assert "cu128's toolkit major 12 matches torch's CUDA 12.8" in fake.record("cu130").reason


def test_newest_toolkit_the_driver_supports(fake):
    fake.gpu(H200, driver=13010)
    fake.image("cu130")
    fake.image("cu131", cuda="13.1.80")
    fake.image("cu132", cuda="13.2.10")  # SASS still runs: a 13.x driver serves any 13.x image's SASS
    sel = fake.select()
    assert sel.chosen.name == "cu132"
    assert "cu132 has the newer toolkit (13.2.10 over 13.0.88)" in fake.record("cu130").reason


def test_patch_version_breaks_toolkit_ties(fake):
    fake.gpu(H200)
    fake.image("cu130-old", cuda="13.0.48")
    fake.image("cu130-new", cuda="13.0.88")
    assert fake.select().chosen.name == "cu130-new"


def test_equal_images_resolved_by_root_order(fake):
    fake.gpu(H200)
    second = fake.add_root("second")
    fake.image("cu130", root=second)
    fake.image("cu130")
    sel = fake.select()
    assert sel.chosen.root == fake.root
    others = [r for r in sel.images if r is not sel.chosen]
    assert others[0].reason == "not chosen: same rank as cu130, which comes earlier in the search order"


# --- devices --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capabilities", [(), "no driver"])
def test_no_gpu_loads_for_registration_only(fake, capabilities):
    if capabilities == ():
        fake.gpu(driver=13000)  # driver present, CUDA_VISIBLE_DEVICES empty
    fake.torch_cuda = None
    fake.image("cu128", cuda="12.8.93")
    fake.image("cu130", sass=[], ptx=["compute_80"])
    sel = fake.select()
    assert not sel.gpu_visible
    assert sel.registration_only
    assert sel.chosen.name == "cu130"  # toolkit preference alone: PTX-only does not count without a device
    assert "no GPU visible" in sel.why and "registration only" in sel.why
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no JIT warning without a device
        loader.load_family("rotary")
    assert fake.loads == [str(fake.root / "cu130" / "astrai_rotary.so")]
    text = loader.info()
    assert "no GPU visible" in text
    assert "cu128" in text and "cu130" in text


def test_no_gpu_ignores_driver_version(fake):
    fake.driver, fake.devices_reason = 11080, "cuInit failed"
    fake.image("cu130")
    assert fake.select().chosen.name == "cu130"


def test_every_device_must_be_served(fake):
    fake.gpu(H200, T4)
    fake.image("cu130")
    sel = fake.select()
    assert sel.chosen is None
    assert "device 1 (Fake GPU sm_75, sm_75) not served" in fake.record("cu130").reason
    with pytest.raises(loader.FamilyUnavailableError, match="device 1 .* not served"):
        loader.load_family("rotary")


def test_mixed_devices_serving_mode(fake):
    fake.gpu(H200, B200, L40)
    fake.image("cu130")
    sel = fake.select()
    assert sel.chosen.serves == "ptx"
    assert sel.chosen.jit == ["device 1 (Fake GPU sm_100, sm_100): 'rotary' through compute_80 PTX"]


def test_every_library_must_serve_every_device(fake):
    fake.gpu(RTX_PRO)
    fake.image("cu130", families=("rotary", "attention"),
               per_family={"attention": {"sass": ["sm_90a"], "ptx": []}})
    assert fake.select().chosen is None
    assert "'attention' has no SASS for sm_120" in fake.record("cu130").reason


# --- errors, API ----------------------------------------------------------------------------------------


def test_error_message_lists_every_image_and_ends_with_info_command(fake, tmp_path):
    fake.gpu(B300, driver=12080)
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93", bad_sha=("rotary",))
    fake.image("cu126", cuda="12.6.20", sass=["sm_90a"], ptx=[])
    fake.image("broken", raw="{")
    fake.set_path(tmp_path / "gone", fake.root)
    with pytest.raises(loader.FamilyUnavailableError) as info:
        loader.load_family("rotary", op="astrai::rotary_embedding")
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0].startswith("astrai-kernels: op astrai::rotary_embedding (family 'rotary') is unavailable")
    assert lines[-1] == "run: python -m astrai.extension info"
    for name, why in [("cu130", "driver too old"), ("cu128", "sha256 mismatch"),
                      ("cu126", "no SASS for sm_103"), ("broken", "malformed image.json")]:
        (line,) = [line for line in lines if line.strip().startswith(f"{name} (")]
        assert "rejected" in line and why in line
    assert "driver CUDA 12.8" in message and "device 0 (Fake GPU sm_103, sm_103)" in message
    assert f"{tmp_path / 'gone'} [ASTRAI_IMAGE_PATH] (does not exist)" in message
    assert f"ASTRAI_IMAGE_PATH={tmp_path / 'gone'}:{fake.root}" in message
    assert "ASTRAI_IGNORE_PACKAGE_IMAGES=1" in message


def test_error_message_with_no_images(fake):
    fake.gpu(H200)
    with pytest.raises(loader.FamilyUnavailableError) as info:
        loader.load_family("rotary")
    message = str(info.value)
    assert "no image found in the search roots" in message
    assert "images seen: none" in message
    assert message.endswith("run: python -m astrai.extension info")


def test_load_failure_is_reported_and_remembered(fake):
    fake.gpu(H200)
    fake.image("cu130")
    fake.load_error = OSError("undefined symbol: torch_library_impl")
    with pytest.raises(loader.FamilyUnavailableError, match="undefined symbol") as info:
        loader.load_family("rotary")
    assert isinstance(info.value.__cause__, OSError)
    fake.load_error = None
    assert not loader.family_available("rotary")  # no retry of a half-registered library
    assert fake.loads == []


def test_real_load_of_dummy_bytes_fails_cleanly(fake, monkeypatch):
    monkeypatch.undo()  # use the real torch.ops.load_library, keep the faked no-GPU machine otherwise
    monkeypatch.setattr(loader, "query_driver_version", fake._driver)
    monkeypatch.setattr(loader, "query_torch", fake._torch)
    monkeypatch.setenv(loader.ENV_IGNORE_PACKAGE_IMAGES, "1")
    monkeypatch.delenv(loader.ENV_IMAGE, raising=False)
    monkeypatch.delenv(loader.ENV_CONDA_PREFIX, raising=False)
    monkeypatch.setenv(loader.ENV_IMAGE_PATH, str(fake.root))
    fake.image("cu130")
    loader.reset()
    with pytest.raises(loader.FamilyUnavailableError, match="loading .*astrai_rotary.so from image cu130 failed"):
        loader.load_family("rotary")


@pytest.mark.parametrize("name", ["", "../rotary", "rot ary", None])
def test_invalid_family_name(fake, name):
    fake.image("cu130")
    assert loader.family_available(name) is False
    with pytest.raises(loader.FamilyUnavailableError, match="not a valid family name"):
        loader.load_family(name)


def test_load_family_is_thread_safe_and_idempotent(fake):
    fake.gpu(H200)
    fake.image("cu130", families=("rotary", "attention"))
    barrier = threading.Barrier(8)
    errors = []

    def worker():
        barrier.wait()
        try:
            loader.load_family("rotary")
            loader.load_family("attention")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    files = ("astrai_rotary.so", "astrai_attention.so")
    assert sorted(fake.loads) == sorted(str(fake.root / "cu130" / f) for f in files)
    assert set(loader.loaded_families()) == {"rotary", "attention"}


def test_selection_is_cached_until_reset(fake):
    fake.gpu(H200)
    fake.image("cu130")
    assert loader.selection() is loader.selection()
    fake.image("cu131", cuda="13.1.80")
    assert loader.selection().chosen.name == "cu130"
    loader.reset()
    assert loader.selection().chosen.name == "cu131"


def test_describe_is_json_and_complete(fake, monkeypatch):
    fake.gpu(H200, B200, driver=13010)
    fake.image("cu130")
    fake.image("cu131", cuda="13.1.80", bad_sha=("rotary",))
    fake.image("cu128", cuda="12.8.93")
    monkeypatch.setenv("CONDA_PREFIX", "/nonexistent/conda")
    loader.reset()
    with pytest.warns(loader.PTXJITWarning):
        loader.load_family("rotary")
    desc = json.loads(json.dumps(loader.describe()))
    assert desc["torch"] == {"version": "2.13.0+fake", "cuda": "13.0", "error": None}
    assert desc["driver"]["cuda"] == "13.1"
    assert desc["gpu_visible"] is True
    assert [d["capability"] for d in desc["devices"]] == ["9.0", "10.0"]
    assert desc["devices"][0]["name"] == "Fake GPU sm_90"
    images = {i["name"]: i for i in desc["images"]}
    assert images["cu130"]["status"] == "chosen"
    assert images["cu130"]["libraries"]["rotary"]["sass"] == ["sm_80", "sm_89", "sm_90a", "sm_120a"]
    assert images["cu130"]["libraries"]["rotary"]["ptx"] == ["compute_80"]
    assert images["cu130"]["toolkit"] == "13.0.88"
    assert images["cu130"]["checksums"] == "verified"
    assert images["cu131"]["status"] == "rejected" and "sha256" in images["cu131"]["reason"]
    assert images["cu131"]["checksums"] == "mismatch"
    assert images["cu128"]["status"] == "eligible" and images["cu128"]["checksums"] == "not checked"
    assert desc["chosen"]["image"] == "cu130" and desc["chosen"]["serves"] == "ptx"
    assert desc["why"]
    assert desc["loaded_families"] == {"rotary": str(fake.root / "cu130" / "astrai_rotary.so")}
    assert set(desc["overrides"]) == {"ASTRAI_IMAGE_PATH", "ASTRAI_IGNORE_PACKAGE_IMAGES", "CONDA_PREFIX"}
    conda = desc["roots"][-1]
    assert conda["status"] == "missing" and conda["path"] == "/nonexistent/conda/lib/astrai-kernels"


def test_info_text_names_the_choice_and_the_rest(fake):
    fake.gpu(H200)
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93")
    text = loader.info()
    assert "device 0   Fake GPU sm_90, compute capability 9.0 (sm_90)" in text
    assert "chosen     cu130 (sass)" in text
    assert "why: not chosen: cu130's toolkit major 13 matches torch's CUDA 13.0" in text
    assert "rotary  sass sm_80 sm_89 sm_90a sm_120a  ptx compute_80" in text


# --- verify ---------------------------------------------------------------------------------------------


def test_verify_reports_mismatch_in_any_image(fake):
    fake.image("cu130")
    fake.image("cu128", cuda="12.8.93", bad_sha=("rotary",))
    fake.image("bad", raw="{")
    report = loader.verify()
    assert report["ok"] is False
    assert report["chosen"] == "cu130"
    rows = {(c["image"], c["family"]): c for c in report["checksums"]}
    assert rows[("cu130", "rotary")]["ok"] is True
    assert rows[("cu128", "rotary")]["ok"] is False and "mismatch" in rows[("cu128", "rotary")]["detail"]
    assert rows[("bad", None)]["ok"] is False
    assert report["loads"] == [{"family": "rotary", "ok": True,
                                "detail": str(fake.root / "cu130" / "astrai_rotary.so")}]
    assert report["smoke_skipped"].startswith("no GPU")
    text = loader.format_verify(report)
    assert "result: FAILED (2 problem(s))" in text


def test_verify_passes_on_good_images(fake):
    fake.image("cu130", families=("rotary", "attention"))
    report = loader.verify()
    assert report["ok"] is True, report["failures"]
    assert "result: OK" in loader.format_verify(report)


def test_verify_missing_library(fake):
    fake.image("cu130", missing=("rotary",))
    report = loader.verify()
    assert report["ok"] is False
    assert any("cannot be read" in c["detail"] for c in report["checksums"])
    assert any(f.startswith("no usable image") for f in report["failures"])


def test_verify_smoke_launches_on_gpu(fake, monkeypatch):
    fake.gpu(H200)
    fake.image("cu130", families=("rotary", "attention", "gemm"))
    calls = []

    def passing():
        calls.append("rotary")

    def failing():
        raise RuntimeError("wrong answer at element 3")

    tests = {"rotary": passing, "attention": failing, "gemm": None}
    monkeypatch.setattr(loader, "torch_cuda_available", lambda: True)
    monkeypatch.setattr(loader, "find_smoke_test", tests.get)
    report = loader.verify()
    smoke = {s["family"]: s for s in report["smoke"]}
    assert calls == ["rotary"]
    assert smoke["rotary"]["status"] == "passed"
    assert smoke["attention"]["status"] == "failed" and "element 3" in smoke["attention"]["detail"]
    assert smoke["gemm"]["status"] == "skipped"
    assert report["ok"] is False
    assert report["failures"] == ["smoke attention: RuntimeError: wrong answer at element 3"]


def test_find_smoke_test_missing_module_is_none():
    assert loader.find_smoke_test("no_such_family_xyz") is None


def test_internal_error_becomes_an_explained_unavailability(fake, monkeypatch):
    def broken(env):
        raise KeyError("boom")

    monkeypatch.setattr(loader, "_scan", broken)
    loader.reset()
    with pytest.raises(loader.FamilyUnavailableError, match="internal loader error .*KeyError"):
        loader.load_family("rotary")
    assert loader.describe()["chosen"] is None


def test_unreadable_root_is_a_reason(fake, monkeypatch):
    fake.gpu(H200)
    fake.image("cu130")
    real_scandir = loader.os.scandir

    def scandir(path):
        if str(path) == str(fake.root):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(loader.os, "scandir", scandir)
    sel = fake.select()
    assert (sel.roots[0].status, sel.roots[0].note) == ("unreadable", "cannot be read: Permission denied")
    assert sel.chosen is None


# --- the façade ------------------------------------------------------------------------------------------

# Every public name of loader.py before it was split into parts (dee9cd6): each still resolves on the façade.
FACADE_NAMES = [
    "Arch", "CONDA_SUBDIR", "ENV_CONDA_PREFIX", "ENV_IGNORE_PACKAGE_IMAGES", "ENV_IMAGE", "ENV_IMAGE_PATH",
    "FamilyUnavailableError", "INFO_COMMAND", "ImageRecord", "Library", "OVERRIDE_VARS", "PACKAGE_LIB_DIR",
    "PTXJITWarning", "Root", "SCHEMA_VERSION", "SOURCE_CONDA", "SOURCE_ENV", "SOURCE_PACKAGE", "Selection",
    "describe", "family_available", "find_smoke_test", "format_info", "format_verify", "info", "load_family",
    "load_library", "loaded_families", "parse_arch", "query_devices", "query_driver_version", "query_torch",
    "reset", "selection", "sha256_file", "torch_cuda_available", "verify",
]


def test_facade_keeps_every_public_name():
    missing = [name for name in FACADE_NAMES if not hasattr(loader, name)]
    assert missing == []
    assert sorted(loader.__all__) == sorted(set(FACADE_NAMES) | {"Device"})


def test_patched_queries_reach_the_selection(fake, monkeypatch):
    fake.gpu(H200)
    fake.image("cu130")
    monkeypatch.setattr(loader, "query_devices", lambda: ((), "patched: no device"))
    loader.reset()
    assert loader.selection().devices_reason == "patched: no device"
    assert loader.describe()["devices_reason"] == "patched: no device"
