"""SAPO Swarm desktop app: a PySide6 client of the node process.

The app never imports torch, transformers, llama_cpp or hivemind (tests/test_app_imports.py
checks it in a fresh interpreter): the node process does the work, the app starts it with
`sapo_core.control` and draws its events. Modules:

- `bridge`: `WorkerBridge`, the node's events as Qt signals on the GUI thread.
- `models`, `eventlog`: plain-Python state the views draw (status, round history, swarm, log).
- `dashboard` (+ `cards`), `try_view`, `swarm_view`, `controls`, `log_view`: the views;
  `export_dialog`: Export…; `jobs`: a `sapo-node` command as a child process; `theme`: colours.
- `wizard` (+ `hardware_scan`): the first run. `window`: the main window. `tray`: the tray icon.
- `settings`: QSettings for the UI, node.toml for the node. `single`: one instance at a time.
- `main`: `sapo-swarm`. `screenshots`: a PNG of each screen. `doctor_probe`: `sapo-node doctor`'s
  Qt checks, run in a child process.
"""

APP_NAME = "SAPO Swarm"
ORG_NAME = "sapo-swarm"
