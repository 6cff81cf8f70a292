"""CSS the chat page needs to behave as designed, apart from its look (static/theme.css): what
Gradio draws that the page must not show."""

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

# No empty button box (drawn as a stray dot) under a line that keeps no button (a reply's stats
# line, a version or waiting line), nor the box of Gradio's Clear, which the theme hides.
NO_DOTS = """
#chatbot .message-row:has(.thought-group) + .message-buttons:not(:has(button[aria-label="Retry"])) { display: none !important; }
#chatbot .message-row:has(.earlier-line) + .message-buttons { display: none !important; }
#chatbot .icon-button-wrapper:has(> button[aria-label="Clear"]):not(:has(> button:not([aria-label="Clear"]))) { display: none !important; }
"""

# The status line stays readable (a part of it wraps whole, never mid-phrase): toasts open under it (PAGE_JS keeps its bottom edge in
# --status-bottom), and the chat's top edge is drawn (the theme keeps the chat itself borderless), so a message scrolled up leaves the chat
# there instead of seeming to slide under the status line.
STATUS_LINE_CLEAR = """
#status-line .wide-only { white-space: nowrap; }
.toast-wrap { top: calc(var(--status-bottom, 64px) + var(--size-2)) !important; }
#chatbot::before { content: ""; position: absolute; top: 0; left: 0; right: 0; z-index: 1; pointer-events: none;
                   border-top: 1px solid var(--border-color-primary); }
#chatbot .bubble-wrap { mask-image: linear-gradient(to bottom, transparent 0, #000 var(--size-3)); }
"""

# A narrow screen (a phone, a half-screen window): the sidebar is a bar above the chat (☰ Chats
# and New chat; the chat list, Manage, Settings and Models open under ☰ Chats: PAGE_JS), so the
# chats are reached without scrolling past the whole conversation; the headers of Manage,
# Settings and Models are 32 px touch targets (they were 20 px), and so is every button and number
# box under them and in the versions bar (25 and 22 px), a chat in the list 40 px (33). The message box sits on a row
# of its own with Attach, Send and Stop under it,
# and the versions bar putting its label on a line of its own under ‹ › and Delete message (beside
# them, an edit's note wrapped to eight lines in a 108 px column).
# A message's buttons (Copy, Edit, Retry: 18 px icons) and the ▸ that opens a reply's details (an 18 px
# button) are 32 px touch targets (Attach is as tall as Send everywhere: theme.css), and the status
# line leaves out its details (view.wide_only: it took four lines above the chat).
# ☰ Chats open is drawn pressed, in the accent's colours, with ▴ (▾ when closed).
# The narrow screen's media query, and its complement for the wide one ("min-width: 641px" left
# fractional widths between 640 and 641 px in neither); PAGE_JS's matchMedia asks the same one.
NARROW_QUERY = "(max-width: 640px)"
NARROW = """
@media not all and __NARROW_QUERY__ {
  #chats-toggle { display: none !important; }
  /* the sidebar scrolls on its own: its open panels made the page ~1,400 px tall, scrolling the chat
     out of view (the page's 16 px margins above and below it: one screen in all) */
  #sidebar { position: sticky; top: 16px; align-self: flex-start; max-height: calc(100vh - 32px); overflow-y: auto; }
  /* a column Gradio lets wrap: a sidebar taller than the screen put all but ☰ Chats and New chat (the
     search, the chat list, Manage, Settings, Models) into a second column, out of view to its right */
  #sidebar { flex-wrap: nowrap !important; }
  /* the chat takes the screen's height less the status line, the versions bar and the message box
     (~210 px): at 70% of it the message box sat at 80% of a 1080 px screen, a fifth of it empty below */
  #main #chatbot { height: max(300px, calc(100vh - 210px)) !important; }
}
@media __NARROW_QUERY__ {
  #sidebar-body button, #versions button { min-height: 32px !important; }
  #sidebar-body button:not(:has(> *:not(svg))) { min-width: 32px !important; }
  #sidebar-body input[type=number] { min-height: 32px !important; }
  #conv-list label { min-height: 40px; align-items: center; }
  #sidebar:not(:has(#chats-toggle[aria-expanded="true"])) #sidebar-body { display: none !important; }
  #sidebar-bar { flex-wrap: nowrap !important; }
  /* ☰ Chats open looks pressed, as the chat shown in the list does (its grey was 2% lighter than
     when closed: a user could not tell it open), and says which way it goes: ▾ opens, ▴ closes */
  #chats-toggle { flex-wrap: nowrap !important; white-space: nowrap; }
  #chats-toggle::after { content: "▾"; margin-left: 0.4em; }
  #chats-toggle[aria-expanded="true"]::after { content: "▴"; }
  #chats-toggle[aria-expanded="true"] { color: var(--mc-accent); border-color: var(--mc-accent);
                                        background: color-mix(in srgb, var(--mc-accent) 14%, var(--background-fill-primary)); }
  #sidebar .label-wrap { min-height: 32px; align-items: center; }
  #chatbot .message-buttons button { min-width: 32px !important; min-height: 32px !important; justify-content: center; }
  #chatbot .thought-group .title { min-height: 32px; }
  #chatbot .thought-group .title .arrow button { min-width: 32px !important; min-height: 32px !important; justify-content: center; }
  #status-line .wide-only { display: none; }
  #main #chatbot { height: 55vh !important; }
  #versions { flex-wrap: wrap !important; row-gap: var(--spacing-sm); }
  #versions > #versions-label { order: 1; flex: 1 1 100% !important; min-width: 0 !important; }
  #versions > #delete-message-btn { flex: 0 0 auto !important; white-space: nowrap; }
  #composer { flex-wrap: wrap !important; }
  #composer > .form:has(#msg-input) { order: -1; flex: 1 1 100% !important; min-width: 100% !important; }
  #composer > * { flex: 1 1 0; }
}
""".replace("__NARROW_QUERY__", NARROW_QUERY)

# A message's edit box (✎): Gradio sizes it from the bubble it replaces, measured wrongly (it was
# 160 px wide and two lines high whatever the message). It takes the width a message can take
# (at least that of the bubble it edits), three lines at least, and grows with the text.
EDIT_BOX = """
#chatbot .message-row:has(textarea.edit-textarea) { width: 100%; }
#chatbot .message-row:has(textarea.edit-textarea) :is(.flex-wrap, .flex-wrap > div, .message) { width: 100%; }
#chatbot textarea.edit-textarea {
  width: 100% !important; box-sizing: border-box; field-sizing: content; resize: vertical;
  min-height: calc(3lh + 2 * var(--spacing-lg)) !important; max-height: 60vh; padding: var(--spacing-lg);
}
"""

# The edit box's ✓ (save) and ✕ (cancel) were Gradio's 18 px icon buttons, as small as Copy's but
# clicked at once after typing: 32 px targets, their icons 18 px.
EDIT_BUTTONS = """
#chatbot .message-buttons button:is([aria-label="Submit"], [aria-label="Cancel"]) {
  min-width: 32px !important; min-height: 32px !important; justify-content: center; align-items: center;
}
#chatbot .message-buttons button:is([aria-label="Submit"], [aria-label="Cancel"]) > div { width: 18px; height: 18px; }
"""

# Continue floats over the chat's bottom right corner (ui.ChatPage._chat_column puts it in a row of
# no height right under the chat; the row's gap is taken back, so nothing below it moves). In the
# composer's row it squeezed the message box whenever it came and went. While it shows, the chat's
# messages end above a strip of their own, so it covers no text.
CONTINUE_FLOATS = """
#continue-anchor { position: relative; height: 0; min-height: 0 !important; padding: 0 !important; overflow: visible; z-index: 2;
                   margin-bottom: calc(-1 * var(--layout-gap)) !important; }
#continue-anchor > #continue-btn { position: absolute; right: var(--size-3); bottom: calc(var(--layout-gap) + var(--size-2));
                                   width: auto !important; max-width: none; min-height: 36px; box-shadow: var(--shadow-drop-lg); }
body:has(#continue-btn) #chatbot .wrapper { padding-bottom: 52px !important; box-sizing: border-box; }
"""

# Gradio's ↓ (back to the end of the chat, shown once the chat is scrolled up) floated over the
# text at the bottom of the chat: while it shows, the messages end above a strip of their own and
# the button sits in it.
SCROLL_DOWN_CLEAR = """
#chatbot .wrapper:has(> .scroll-down-button-container) { padding-bottom: 40px; box-sizing: border-box; }
#chatbot .scroll-down-button-container { bottom: 7px !important; }
"""

# A code block's copy button (Gradio's, at its top right corner) lay over the code's first line:
# a one-line block's text ran under it. The block keeps a strip of its own above the code for the
# button, so no line of code, scrolled sideways or not, shares a row with it.
CODE_COPY_CLEAR = """
#chatbot .code_wrap > pre { padding-top: 28px !important; }
#chatbot .code_wrap > .copy_code_button { top: 2px !important; right: 2px !important; }
"""

# The chat list by keyboard (PAGE_JS makes each chat focusable): the chat with the focus is ringed,
# as Gradio rings its buttons.
CHAT_LIST_FOCUS = """
#conv-list label:focus-visible { outline: 2px solid var(--mc-accent, var(--color-accent)); outline-offset: -2px; }
"""

# A long chat title is cut with "…" before the time the chat was last used, which stays in view
# (PAGE_JS puts the time in an element of its own and keeps its width, in ch, in --when): the
# list's label was cut at its end, time and all. The label's text takes the row's whole width, so
# the title gets all the room the time leaves (as a shrink-to-fit span it cut even short titles
# to a few letters). A title too long for its row is cut in its middle: what tells it from the other
# titles (its last words, or from the word where it stops sharing its beginning with another: PAGE_JS
# puts them in .chat-tail, their width in --tail) stays in view after the "…", so chats whose titles
# start alike do not look the same ("Can you explai…" twice at 1280 px). All of it inline (flex items
# would put line breaks into the label's text, which stays "title · time").
CHAT_LIST_TIME = """
#conv-list label > span { display: block; flex: 1 1 auto; min-width: 0; white-space: nowrap; }
#conv-list .chat-title { display: inline-block; vertical-align: top; max-width: calc(100% - var(--when, 0px));
                         overflow: hidden; white-space: nowrap; }
#conv-list .chat-head { display: inline-block; vertical-align: top; max-width: calc(100% - var(--tail, 0px));
                        overflow: hidden; text-overflow: ellipsis; white-space: pre; }
#conv-list .chat-tail { display: inline-block; vertical-align: top; max-width: var(--tail, 0px);
                        overflow: hidden; text-overflow: ellipsis; white-space: pre; }
#conv-list .chat-when { white-space: pre; }
"""

# With many chats the list pushed Manage, Settings and Models down the sidebar, out of reach (120
# chats put Settings at y = 4,430 px on an 860 px screen): the list scrolls on its own, in the room
# the screen leaves them (its ~360 px: the bar, the search, the three panels' headers), never less
# than ~6 chats. PAGE_JS brings the chat shown into the list's view when it changes.
CHAT_LIST_SCROLLS = """
#conv-list > .wrap:has(> label) { max-height: max(200px, calc(100vh - 360px)); overflow-y: auto; overscroll-behavior: contain;
                                  flex-wrap: nowrap !important; }  /* Gradio's column wraps: chats went into columns to its right */
"""

# Inline code with no space in it (a long name, a hash, 120 x's) ran past its message's right edge
# and made the whole chat scroll sideways: it wraps anywhere, as a long link does. A code block
# keeps its lines and scrolls inside itself.
LONG_INLINE_CODE = """
#chatbot :not(pre) > code { white-space: pre-wrap; overflow-wrap: anywhere; }
"""

PAGE_CSS = LONG_INLINE_CODE + CHAT_LIST_TIME + CHAT_LIST_SCROLLS + CHAT_LIST_FOCUS + HIDDEN_PROGRESS + NO_RETRY_WHILE_REPLYING + NO_DOTS + STATUS_LINE_CLEAR + NARROW + EDIT_BOX + EDIT_BUTTONS + CONTINUE_FLOATS + SCROLL_DOWN_CLEAR + CODE_COPY_CLEAR
