"""CSS the chat page needs to behave as designed, apart from its look (assets/theme.css, which an
installed wheel may lack): what Gradio draws that the page must not show."""

from __future__ import annotations

# Gradio keeps the progress of an event with show_progress="hidden" ("queue: 1/1 | 0.1s",
# "processing | 2.3s") in the page, only transparent (its class "hide", opacity 0): a screen
# reader, a copy of the status line or of a message, and a test's inner_text all read it inside
# the output. Taken out of the page instead; a progress Gradio does show has no "hide".
HIDDEN_PROGRESS = """
.gradio-container [data-testid="status-tracker"].hide { display: none !important; }
"""

# ↻ (Retry) is offered once the reply has ended: while the shown chat replies (Stop is red then,
# ChatPage.render) it would be refused. The line it sits under keeps no other button (NO_DOTS).
NO_RETRY_WHILE_REPLYING = """
body:has(#stop-btn.stop) #chatbot button[aria-label="Retry"] { display: none !important; }
body:has(#stop-btn.stop) #chatbot .message-row:has(.thought-group) + .message-buttons { display: none !important; }
"""

PAGE_CSS = HIDDEN_PROGRESS + NO_RETRY_WHILE_REPLYING
