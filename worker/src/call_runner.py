# A warm Python runner: runs remote function calls (`@gl.remote`) one after another in one
# long-lived interpreter, so imports stay loaded between calls.
#
# The worker starts it with `python -u -c <this file>` in its slot's directory and listens on
# the Unix socket named by GPULAYER_RUNNER_SOCKET. Over it, one JSON object per line:
#   runner -> worker  {"ready": "3.11.7"}  once, or it exits 3 saying why on stderr
#   worker -> runner  {"call": SEQ, "job": ID, "function": DIGEST, "function_path": PATH,
#                      "args": B64, "max_result": BYTES, "env": {K: V}}
#   runner -> worker  {"done": SEQ, "ok": BOOL, "payload": B64 | null, "error": {...} | null}
# The call's own output goes to the runner's stdout and stderr, which the worker reads as
# the call's log lines; after each call the runner writes the line "\x1egpulayer-end SEQ" to
# both, before answering, so the worker knows where one call's lines end.
import base64
import json
import os
import socket
import sys
import traceback

try:
    import cloudpickle
except ImportError as e:
    sys.stderr.write(
        f"cloudpickle is not installed for {sys.executable} ({e}); "
        f"install it there: {sys.executable} -m pip install cloudpickle\n"
    )
    sys.exit(3)

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ.pop("GPULAYER_RUNNER_SOCKET"))
reader = sock.makefile("rb")


def send(message):
    sock.sendall(json.dumps(message).encode() + b"\n")


functions = {}


def load(digest, path):
    fn = functions.get(digest)
    if fn is None:
        with open(path, "rb") as f:
            fn = cloudpickle.load(f)
        if len(functions) > 64:
            functions.clear()
        functions[digest] = fn
    return fn


def describe(exc):
    """An exception as the caller rebuilds it: pickled when possible, always with its type,
    message and the remote traceback as text."""
    # From the function's own frame on: the runner's frame is no news to the caller.
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        pickled = base64.b64encode(cloudpickle.dumps(exc)).decode()
    except Exception:
        pickled = None
    kind = type(exc)
    return {
        "type": kind.__qualname__,
        "module": kind.__module__,
        "message": str(exc),
        "traceback": text,
        "pickled": pickled,
    }


def run(msg):
    saved = {k: os.environ.get(k) for k in msg.get("env", {})}
    os.environ.update(msg.get("env", {}))
    try:
        fn = load(msg["function"], msg["function_path"])
        args, kwargs = cloudpickle.loads(base64.b64decode(msg["args"]))
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything the call raised goes back
        return {"ok": False, "payload": None, "error": describe(exc)}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        payload = cloudpickle.dumps(value)
    except Exception as exc:
        err = describe(exc)
        err["kind"] = "serialization"
        err["message"] = f"the result of the call cannot be pickled: {exc}"
        return {"ok": False, "payload": None, "error": err}
    limit = msg.get("max_result") or 0
    if limit and len(payload) > limit:
        return {
            "ok": False,
            "payload": None,
            "error": {
                "kind": "too_large",
                "type": "ResultTooLarge",
                "module": "gpulayer.errors",
                "message": (
                    f"the result is {len(payload)} bytes pickled, more than the server's limit "
                    f"of {limit} (GPULAYER_MAX_RESULT_BYTES on the worker); return less, or write large "
                    "data to files under $GPULAYER_OUTPUT_DIR"
                ),
                "traceback": "",
                "pickled": None,
            },
        }
    return {"ok": True, "payload": base64.b64encode(payload).decode(), "error": None}


send({"ready": "%d.%d.%d" % sys.version_info[:3]})
for line in reader:
    msg = json.loads(line)
    answer = run(msg)
    answer["done"] = msg["call"]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    marker = b"\x1egpulayer-end %d\n" % msg["call"]
    os.write(1, marker)
    os.write(2, marker)
    send(answer)
