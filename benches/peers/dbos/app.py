"""The peer workflow on DBOS: one HTTP endpoint (FastAPI under uvicorn, one
process) that runs a DBOS workflow of three steps, each a trivial pure
function, and answers when the workflow has completed. The system database
is the PostgreSQL database named by DBOS_SYSTEM_DATABASE_URL (run.sh makes
a scratch one and drops it afterwards).

    python app.py --port 18282
"""

import argparse
import os

import uvicorn
from dbos import DBOS, DBOSConfig
from fastapi import FastAPI

app = FastAPI()

config: DBOSConfig = {
    "name": "poimen-peers-bench",
    "system_database_url": os.environ["DBOS_SYSTEM_DATABASE_URL"],
    "log_level": "WARNING",
}
DBOS(config=config)


@DBOS.step()
def step1(n: int) -> dict:
    return {"n": n + 1}


@DBOS.step()
def step2(a: dict) -> dict:
    return {"n": a["n"] + 1}


@DBOS.step()
def step3(b: dict) -> dict:
    return {"n": b["n"] + 1, "status": "completed"}


@DBOS.workflow()
def bench_workflow(n: int) -> dict:
    a = step1(n)
    b = step2(a)
    return step3(b)


@app.post("/run")
def run(body: dict) -> dict:
    return bench_workflow(int(body.get("n", 0)))


@app.get("/health")
def health() -> dict:
    return {"ok": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18282)
    args = parser.parse_args()
    DBOS.launch()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
