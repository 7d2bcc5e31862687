"""Evaluate on shards in parallel: each `shard` pod scores its slice and serves the result on port
8000; the `report` pod collects them by DNS name and hands the total to Airflow."""

import http.server
import json
import os
import socket
import time
import urllib.request

SHARDS = int(os.environ["SHARDS"])
JOB = os.environ["HOSTNAME"].rsplit("-", 2)[0]  # <job>-<task>-<index>


def score(index: int) -> dict:
    rows = range(index, 1000, SHARDS)
    correct = sum(1 for row in rows if row % 7 != 0)  # stands in for a model's predictions
    return {"shard": index, "rows": len(rows), "correct": correct}


def serve_once(result: dict) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(result).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

    with http.server.HTTPServer(("", 8000), Handler) as server:
        server.handle_request()


def collect(index: int) -> dict:
    url = f"http://{JOB}-shard-{index}.{JOB}:8000/"
    for _ in range(120):
        try:
            return json.load(urllib.request.urlopen(url, timeout=5))
        except (OSError, socket.timeout):
            time.sleep(1)
    raise SystemExit(f"shard {index} never answered at {url}")


if os.environ["ROLE"] == "shard":
    index = int(os.environ["VC_TASK_INDEX"])
    result = score(index)
    print(f"shard {index}: {result['correct']}/{result['rows']} correct", flush=True)
    serve_once(result)
else:
    results = [collect(index) for index in range(SHARDS)]
    rows, correct = sum(r["rows"] for r in results), sum(r["correct"] for r in results)
    print(f"accuracy over {SHARDS} shards: {correct}/{rows} = {correct / rows:.4f}", flush=True)
    with open("/dev/termination-log", "w") as out:
        json.dump({"accuracy": correct / rows, "rows": rows, "shards": SHARDS}, out)
