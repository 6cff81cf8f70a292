"""The chat page's JavaScript: the page script (static/page.js), run once as the page is set up
(``PAGE_JS``), and the small functions Gradio events run in the browser before or after their
handler (``*_JS``), each one call of a ``window.minisgl*`` function that the page script defines.

The page script takes its configuration as one JSON object, ``PAGE_CONFIG``."""

from __future__ import annotations

import json
from importlib.resources import files

from ..chat.store import ChatSettings
from .css import NARROW_QUERY
from .tabs import TAB_SILENT_S

ANSWER_WAIT_S = 15.0  # how long an event that takes the box waits for the answer of the one before
# The title box, the settings and the backend, in the order of ChatPage.fields (the page's tab_fields)
FIELD_IDS = (
    "title-input",
    "system-prompt",
    "temperature",
    "top-p",
    "max-tokens",
    "thinking",
    "top-k",
    "seed",
    "stop-strings",
    "repetition-penalty",
    "context-policy",
    "backend",
)
DRAFT_KEY_PREFIX = "minisgl-chat:draft:"  # + the chat's id ('' for a new chat): its unsent text in the browser's storage
SHOWN_CHAT_KEY = "minisgl-chat:shown"  # the chat the tab showed last, in the browser's storage (ChatPage.load_page)
# ?chat=new: the tab shows a new chat (its load asks for chat 0: ViewEvents.load_page)
NEW_CHAT = "new"
# the names of the files attached in a tab, in the tab's own storage: those a reload did not
# bring back are said after it
ATTACHED_KEY = "minisgl-chat:attached"
# a random key of the browser tab, in its own storage (a reload keeps it): the page's load names
# it, and the files attached before the reload come back (TabState.claim_files)
TAB_KEY = "minisgl-chat:tab"
# where a page's beacon goes as its tab goes (mount.TabClosedBeacon), from the page's address
TAB_CLOSED_PATH = "tab-closed"

# What page.js reads as `config` (its header says what each is for).
PAGE_CONFIG = {
    "narrowQuery": NARROW_QUERY,
    "answerWaitMs": round(ANSWER_WAIT_S * 1000),
    "fieldIds": list(FIELD_IDS),
    "draftKeyPrefix": DRAFT_KEY_PREFIX,
    "shownChatKey": SHOWN_CHAT_KEY,
    "newChat": NEW_CHAT,
    "attachedKey": ATTACHED_KEY,
    "tabKey": TAB_KEY,
    "tabClosedPath": TAB_CLOSED_PATH,
    "tabSilentMs": round(TAB_SILENT_S * 1000),
    "sliderDefaults": {
        "temperature": ChatSettings.temperature,
        "top-p": ChatSettings.top_p,
        "repetition-penalty": ChatSettings.repetition_penalty,
    },
}
PAGE_SCRIPT = (files("minisgl_app") / "static" / "page.js").read_text(encoding="utf-8")
# Gradio 6 runs a `js` that is not one function expression as the body of a function, at once:
# the window.minisgl* functions exist before the page's load events run their own js (MARK_LOADED_JS,
# ASKED_CHATS_JS, REMEMBER_SHOWN_CHAT_JS). A function expression would be called a step later.
PAGE_JS = f"{PAGE_SCRIPT}\nminisglStartPage({json.dumps(PAGE_CONFIG)});\n"


def page_call(name: str) -> str:
    """An event's ``js``: its inputs handed to the page script's ``window.<name>``, whose answer is the event's."""
    return f"(...inputs) => window.{name}(...inputs)"


# Stop pressed just after Enter can reach the server before the message does (two events of one
# tab may start in either order). Both carry the browser's click time (STAMP_JS), so a Stop that
# found nothing to stop also stops a message clicked before it, and never one clicked after it.
# So do a settings box's save and the clicks that show another chat (ChatPage.settings_changed).
STAMP_JS = page_call("minisglStamp")  # the stamp is an event's last input
# The events that take the message box's text (the clicks that show another chat, Send) take
# turns and empty the box at once; each answer gives back what goes before what was typed since
# (ChatPage.draft_for_box). page.js's takeTurnsAtTheMessageBox says how.
LEAVE_CHAT_SELECT_JS = page_call("minisglLeaveChatSelect")  # the chat, the stamp, the box
LEAVE_CHAT_IMPORT_JS = page_call("minisglLeaveChatImport")  # the file, the stamp, the box
LEAVE_CHAT_NEW_JS = page_call("minisglLeaveChatNew")  # the stamp, the box, the settings boxes
APPLY_DRAFT_JS = page_call("minisglApplyDraft")  # the answer (ChatPage.draft_for_box) gives back
RESTORE_DRAFT_JS = page_call("minisglGiveBackOnFailure")  # the event failed: its text goes back
# Send: the box's text, the settings boxes, its stamp, and whether it followed a click that showed
# another chat (ChatPage.send does not save the settings boxes then)
SEND_JS = page_call("minisglSend")
EDITING_JS = page_call(
    "minisglEditing"
)  # whether a message's edit box (✎) is open: the tick leaves the chat alone then
# the tick answered: a note that the page cannot reach the app goes (page.js, noteWhenUnanswered)
TICK_ANSWERED_JS = page_call("minisglTickAnswered")
# A redraw of the title and settings boxes (after a change elsewhere) is asked, with its number,
# and answered later (ChatPage.redraw_boxes): a box the user changed in between keeps the user's value.
FOCUSED_FIELD_JS = page_call("minisglFocusedField")  # asked: the box with the keyboard's focus
APPLY_REDRAWN_FIELDS_JS = page_call(
    "minisglApplyRedrawnFields"
)  # answered: the values for the boxes left alone
# Set once the page's load has been answered and drawn: tests wait for it.
MARK_LOADED_JS = page_call("minisglMarkLoaded")
# A reload opens the chat the tab showed (its address, else the browser's storage: ChatPage.load_page)
ASKED_CHATS_JS = page_call("minisglAskedChats")
REMEMBER_SHOWN_CHAT_JS = page_call("minisglRememberShownChat")
# After a reload, once the files attached to the chat shown are drawn: those that did not come back
SAY_FILES_DROPPED_JS = page_call("minisglSayFilesDropped")
SYNC_SEND_JS = page_call(
    "minisglSyncSend"
)  # the message box written by Gradio (a refused edit's text)
CLICK_DOWNLOAD_JS = page_call("minisglClickDownload")
CLICK_SEND_JS = page_call(
    "minisglClickSend"
)  # Send pressed for the user (Attachments.send_first_part)


def confirm_js(question: str) -> str:
    """Ask in the browser first; the handler gets the answer as its input."""
    return f"() => window.minisglConfirm({json.dumps(question)})"


# Delete message asks first, unless the chat replies (Stop has a reply to stop): then the handler
# gets None and refuses at once, instead of asking and then refusing
CONFIRM_DELETE_MESSAGE_JS = page_call("minisglConfirmDeleteMessage")
# Delete chat names the chat in its question; confirmed, the click is its own (a stamp, the box emptied)
CONFIRM_DELETE_CHAT_JS = page_call("minisglConfirmDeleteChat")
