"""A faithful local rendering of a Block Kit message (header, mrkdwn sections with fields, code,
buttons) as HTML, for screenshots in the docs; no Slack needed, nothing fetched."""

import html
import re


def _decoded(text: str) -> str:
    # Slack's three entities, as Slack shows them (after links and code are found, as Slack does).
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _mrkdwn(text: str) -> str:
    parts = re.split(r"```(.*?)```", text, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f'<pre class="code">{html.escape(_decoded(part))}</pre>')
            continue
        for j, piece in enumerate(re.split(r"<(https?://[^|>]+\|[^>]+)>", part)):
            if j % 2:
                url, label = piece.split("|", 1)
                out.append(f'<a href="{html.escape(url)}">{html.escape(_decoded(label))}</a>')
                continue
            escaped = html.escape(_decoded(piece))
            escaped = re.sub(r"\*(.+?)\*", r"<b>\1</b>", escaped)
            out.append(escaped.replace("\n", "<br>"))
    return "".join(out)


def _block(block: dict) -> str:
    kind = block["type"]
    if kind == "header":
        return f'<div class="header">{html.escape(block["text"]["text"])}</div>'
    if kind == "section":
        body = _mrkdwn(block["text"]["text"]) if "text" in block else ""
        fields = "".join(
            f'<div class="field">{_mrkdwn(f["text"])}</div>' for f in block.get("fields", [])
        )
        return f'<div class="section">{body}{f"<div class=fields>{fields}</div>" if fields else ""}</div>'
    if kind == "actions":
        buttons = "".join(
            f'<span class="button {e.get("style", "")}">{html.escape(e["text"]["text"])}</span>'
            for e in block["elements"]
        )
        return f'<div class="actions">{buttons}</div>'
    return ""


CSS = """
body { margin: 0; background: #fff; font: 15px/1.46668 -apple-system, 'Segoe UI', Lato, Helvetica,
  Arial, sans-serif; color: #1d1c1d; }
.msg { display: flex; gap: 8px; padding: 16px 20px; width: 640px; }
.avatar { width: 36px; height: 36px; border-radius: 4px; background: #1d4ed8; color: #fff;
  font-weight: 700; display: flex; align-items: center; justify-content: center; flex: none; }
.who { font-weight: 900; } .app { background: #e8e8e8; color: #616061; font-size: 10px;
  padding: 1px 3px; border-radius: 2px; margin: 0 4px; font-weight: 700; }
.time { color: #616061; font-size: 12px; }
.header { font-size: 18px; font-weight: 900; margin: 6px 0 4px; }
.section { margin: 6px 0; } .fields { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 16px;
  margin-top: 4px; }
.code { background: #f8f8f8; border: 1px solid #ddd; border-radius: 4px; padding: 8px;
  font: 12px/1.5 Monaco, Menlo, Consolas, monospace; white-space: pre-wrap; margin: 4px 0; }
.actions { display: flex; gap: 8px; margin-top: 10px; flex-wrap: wrap; }
.button { border: 1px solid #ddd; border-radius: 4px; padding: 3px 12px; font-weight: 700;
  font-size: 13px; line-height: 26px; background: #fff; }
.button.primary { background: #007a5a; border-color: #007a5a; color: #fff; }
.button.danger { background: #e01e5a; border-color: #e01e5a; color: #fff; }
"""


def slack_preview_html(payload: dict, *, bot: str = "GPU Portal", at: str = "10:42 AM") -> str:
    blocks = "".join(_block(b) for b in payload["blocks"])
    return (
        f"<!doctype html><html><head><meta charset=utf-8><style>{CSS}</style></head><body>"
        f'<div class="msg"><div class="avatar">G</div><div><span class="who">{bot}</span>'
        f'<span class="app">APP</span><span class="time">{at}</span>{blocks}</div></div>'
        "</body></html>"
    )
