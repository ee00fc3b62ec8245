"""tpcheck's PEP 517 build backend: scikit-build-core's, with the wheel tagged for the glibc
it was built against.

scikit-build-core tags a Linux wheel `linux_x86_64`, which pip installs anywhere, also where
the module cannot load. The wheel tpcheck builds needs nothing outside itself but glibc,
libstdc++ and libgcc (cmake/TpcheckDependencies.cmake bundles the rest;
tests/python/test_wheel.py checks it), so it is tagged `manylinux_X_Y_<arch>` with X.Y this
machine's glibc (packaging's most specific tag for it): pip on a machine with an older
glibc refuses it instead of installing a module that fails to load. The build machine's
glibc is an upper bound of what the module asks for, and its libstdc++ is the one its
distribution pairs with that glibc. TPCHECK_WHEEL_PLATFORM=<tag> names another platform tag
(`linux_x86_64` keeps scikit-build-core's).
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

from scikit_build_core import build as _backend

# Every hook but build_wheel is scikit-build-core's own.
for _hook in ("build_sdist", "build_editable", "get_requires_for_build_sdist",
              "get_requires_for_build_wheel", "get_requires_for_build_editable",
              "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"):
    if hasattr(_backend, _hook):
        globals()[_hook] = getattr(_backend, _hook)


def _platform_tag() -> str | None:
    named = os.environ.get("TPCHECK_WHEEL_PLATFORM")
    if named:
        return named
    if not sys.platform.startswith("linux"):
        return None
    from packaging import tags  # scikit-build-core's own dependency

    for tag in tags.sys_tags():  # most specific first: this glibc's manylinux_X_Y
        if tag.platform.startswith("manylinux_"):
            return tag.platform
    return None


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _retag(directory: str, name: str, platform: str) -> str:
    """The wheel `name` in `directory`, its platform tag replaced (file name, WHEEL, RECORD)."""
    stem, parts = name[:-len(".whl")], name[:-len(".whl")].split("-")
    old = parts[-1]
    if old == platform:
        return name
    new_name = "-".join(parts[:-1] + [platform]) + ".whl"
    src_path, dst_path = os.path.join(directory, name), os.path.join(directory, new_name)
    # Written again anyway: deflate's level 9 (0.15 MB less than scikit-build-core's default).
    with zipfile.ZipFile(src_path) as src, \
            zipfile.ZipFile(dst_path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_info, wheel_file, wheel_data = None, None, b""
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                record_info, record = info, data.decode()
                continue
            if info.filename.endswith(".dist-info/WHEEL"):
                lines = [line.replace(f"-{old}", f"-{platform}") if line.startswith("Tag:") else line
                         for line in data.decode().splitlines(keepends=True)]
                data = "".join(lines).encode()
                wheel_file, wheel_data = info.filename, data
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data, compresslevel=9)
        if record_info is None or wheel_file is None:
            raise RuntimeError(f"{name}: no WHEEL or RECORD in its dist-info ({stem})")
        rows = []
        for row in record.splitlines():
            if row.startswith(wheel_file + ","):
                row = f"{wheel_file},{_record_hash(wheel_data)},{len(wheel_data)}"
            rows.append(row)
        dst.writestr(record_info, "\n".join(rows) + "\n", compresslevel=9)
    os.remove(src_path)
    return new_name


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    name = _backend.build_wheel(wheel_directory, config_settings, metadata_directory)
    platform = _platform_tag()
    if platform is None or not name.endswith(".whl"):
        return name
    return _retag(wheel_directory, name, platform)
