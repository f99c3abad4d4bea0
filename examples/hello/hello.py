"""The quickstart job: says where it runs, streams a few lines, and writes output files.

Run by `gpulayer submit --source examples/hello --output 'hello-*.txt' --follow -- python3 hello.py`.
The worker sets GPULAYER_JOB_ID and GPULAYER_OUTPUT_DIR; outside GPUlayer it runs as job "local".
"""

import os
import platform
import socket
import time

N_LINES = 5
# Slow enough that `--follow` visibly streams the lines as they come.
PAUSE_SECONDS = 0.2


def main() -> None:
    job_id = os.environ.get("GPULAYER_JOB_ID", "local")
    host = socket.gethostname()
    print(
        f"hello from GPUlayer job {job_id}: python {platform.python_version()} on {host}",
        flush=True,
    )

    for i in range(1, N_LINES + 1):
        print(f"line {i} of {N_LINES}", flush=True)
        time.sleep(PAUSE_SECONDS)

    # Matched by the job's `--output 'hello-*.txt'` glob, in the job's working directory.
    hello_path = os.path.join(os.getcwd(), f"hello-{job_id}.txt")
    with open(hello_path, "w", encoding="utf-8") as f:
        f.write(f"hello from job {job_id} on {host}\n")
    print(f"wrote {hello_path}", flush=True)

    # Everything in GPULAYER_OUTPUT_DIR is returned too, whatever its name.
    output_dir = os.environ.get("GPULAYER_OUTPUT_DIR")
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        greeting_path = os.path.join(output_dir, "greeting.txt")
        with open(greeting_path, "w", encoding="utf-8") as f:
            f.write(f"greetings from job {job_id} (python {platform.python_version()})\n")
        print(f"wrote {greeting_path}", flush=True)


if __name__ == "__main__":
    main()
