"""Joining a TLS cluster through dask config, as docs/cluster.md shows it; each TLS
misconfiguration is one error naming the dask config keys (exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import zarr
from distributed import Client, Security

from cluster.lifecycle import connect
from cluster.security import CA_KEY, CERT_KEY, KEY_KEY
from pipeline.errors import ClusterError
from tests.cluster.processes import QUIET_HTTP, START_TIMEOUT_S, read_address, spawn, stop
from tests.helpers import REPO, assert_product, random_matrix, run_cli, write_array

DOCS = REPO / "docs" / "cluster.md"
TLS_KEYS = (CA_KEY, CERT_KEY, KEY_KEY)


@dataclass
class TlsCluster:
    address: str
    files: dict[str, str]
    """PEM files by role: ca, cert, key (the cluster's), other-cert, other-key (foreign)."""


def write_credentials(folder: Path) -> dict[str, str]:
    """One self-signed certificate for every role, as docs/cluster.md makes it with openssl
    (and distributed's Security.temporary() in memory), plus a foreign one."""
    ours, other = Security.temporary(), Security.temporary()
    texts = {
        "ca": ours.tls_ca_file,
        "cert": ours.tls_client_cert,
        "key": ours.tls_client_key,
        "other-cert": other.tls_client_cert,
        "other-key": other.tls_client_key,
    }
    files = {}
    for name, text in texts.items():
        path = folder / f"{name}.pem"
        path.write_text(text)
        path.chmod(0o600)
        files[name] = str(path)
    return files


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    """`dask scheduler --protocol tls` and one `dask worker` with the credentials, as
    docs/cluster.md starts them (on loopback, without a nanny to start faster)."""
    root = tmp_path_factory.mktemp("tls-cluster")
    files = write_credentials(root)
    tls = ("--tls-ca-file", files["ca"], "--tls-cert", files["cert"], "--tls-key", files["key"])
    scheduler_file = root / "scheduler.json"
    processes = []
    try:
        processes.append(
            spawn(
                "distributed.cli.dask_scheduler",
                *("--protocol", "tls", "--host", "127.0.0.1", "--port", "0", *QUIET_HTTP),
                *("--scheduler-file", str(scheduler_file), *tls),
                log=root / "scheduler.log",
            )
        )
        address = read_address(scheduler_file, processes[0])
        processes.append(
            spawn(
                "distributed.cli.dask_worker",
                *(address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny", *tls),
                *(*QUIET_HTTP, "--memory-limit", "2GiB", "--death-timeout", "60"),
                log=root / "worker.log",
            )
        )
        with Client(address, security=tls_security(files), timeout=START_TIMEOUT_S) as client:
            client.wait_for_workers(1, timeout=START_TIMEOUT_S)
        yield TlsCluster(address, files)
    finally:
        for process in reversed(processes):
            stop(process)


def tls_security(files: dict[str, str]) -> Security:
    return Security(
        tls_ca_file=files["ca"], tls_client_cert=files["cert"], tls_client_key=files["key"]
    )


def documented_tls_yaml(folder: str) -> str:
    """The dask config file of docs/cluster.md's "Joining a TLS cluster", its paths in folder."""
    text = DOCS.read_text()
    section = text[text.index("## 6. Joining a TLS cluster") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") :]
    return block[: block.index("```")].replace("/home/me/.dask-tls/", f"{folder}/")


def small_inputs(folder: Path) -> tuple[Any, Any, str, str]:
    rng = np.random.default_rng(16)
    a, b = random_matrix(rng, (37, 29), "float32"), random_matrix(rng, (29, 23), "float32")
    return (
        a,
        b,
        write_array(folder / "a.zarr", a, (10, 8)),
        write_array(folder / "b.zarr", b, (8, 9)),
    )


def test_multiply_joins_a_tls_cluster_as_documented(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    # docs/cluster.md's config file, with the names the test's credentials have
    config = tmp_path / "dask-config"
    config.mkdir()
    folder = Path(tls_cluster.files["ca"]).parent  # its cert.pem is self-signed: its own CA
    (config / "tls.yaml").write_text(documented_tls_yaml(str(folder)))
    a, b, a_url, b_url = small_inputs(tmp_path)
    out = str(tmp_path / "c.zarr")
    done = run_cli(
        *("multiply", a_url, b_url, out, "--scheduler", tls_cluster.address, "--no-progress"),
        env={"DASK_CONFIG": str(config)},
    )
    assert done.returncode == 0, done.stderr
    assert f"connected to {tls_cluster.address}" in done.stderr
    assert_product(zarr.open_array(out, mode="r")[:], a, b)


def tls_config(files: dict[str, str], **changes: str | None) -> dict[str, str | None]:
    """dask config for a client with the cluster's credentials, but for ``changes``."""
    keys = {"ca": CA_KEY, "cert": CERT_KEY, "key": KEY_KEY}
    chosen = {"ca": files["ca"], "cert": files["cert"], "key": files["key"], **changes}
    return {keys[role]: chosen[role] for role in keys}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # a tls:// address and no TLS settings at all
        (
            {"ca": None, "cert": None, "key": None},
            rf"TLS scheduler but dask config has no {CA_KEY} and no {CERT_KEY}; set ",
        ),
        # no client certificate: the scheduler would refuse the handshake
        ({"cert": None}, rf"has no {CERT_KEY}; set {CA_KEY}, {CERT_KEY} and {KEY_KEY}"),
        # the CA file named is not there
        ({"ca": "{dir}/missing.pem"}, rf"{CA_KEY} is \S+missing.pem, which cannot be read"),
        # the certificate named can't be read (a folder)
        ({"cert": "{dir}"}, rf"{CERT_KEY} is \S+, which cannot be read \(Is a directory\)"),
        # a key that is not the certificate's
        ({"key": "{dir}/other-key.pem"}, r"the TLS files in dask config do not load \("),
        # a certificate the cluster's CA did not sign: refused by the scheduler itself
        (
            {"cert": "{dir}/other-cert.pem", "key": "{dir}/other-key.pem"},
            rf"cannot reach the scheduler at tls://\S+ .* that {CA_KEY} is the cluster's CA",
        ),
    ],
)
def test_tls_misconfiguration_names_the_keys(
    tls_cluster: TlsCluster, changes: dict[str, str | None], message: str
) -> None:
    folder = str(Path(tls_cluster.files["ca"]).parent)
    changes = {k: v.format(dir=folder) if v else v for k, v in changes.items()}
    with (
        dask.config.set(tls_config(tls_cluster.files, **changes)),
        pytest.raises(ClusterError, match=message),
        connect(tls_cluster.address),
    ):
        pass


def test_required_encryption_refuses_a_tcp_address() -> None:
    with (
        dask.config.set({"distributed.comm.require-encryption": True}),
        pytest.raises(ClusterError, match=r"require-encryption is true .* give its tls://"),
        connect("tcp://127.0.0.1:1"),
    ):
        pass


def test_cli_tls_misconfiguration_is_one_error_line(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    _, _, a_url, b_url = small_inputs(tmp_path)
    out = tmp_path / "c.zarr"
    unset = {f"DASK_{k.upper().replace('.', '__').replace('-', '_')}": None for k in TLS_KEYS}
    done = run_cli(
        *("multiply", a_url, b_url, str(out), "--scheduler", tls_cluster.address),
        env={**unset, "DASK_CONFIG": str(tmp_path)},  # no config file of the user's either
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert CA_KEY in errors[0] and "DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in errors[0]
    assert not out.exists()
