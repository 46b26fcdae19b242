"""Two `spoc tune` processes (one `--worker`) sharing one study in a real PostgreSQL, as workers on
several GPU hosts would; each trial starts a real `spoc sim` server and runs a real Locust ramp."""

from tests.e2e.test_tune_cli import files, run_two_workers  # noqa: F401 (fixture)


def test_two_workers_share_a_postgresql_study(files, postgres_url):  # noqa: F811
    run_two_workers(files, postgres_url, secret=postgres_url.split(":")[2].split("@")[0])
