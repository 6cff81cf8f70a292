// The chat page's script. app/page/scripts.py hands it to Gradio as the page's `js` (run once, as
// the page is set up, before the events of its load), followed by one call of minisglStartPage
// with the page's configuration, a JSON object (scripts.PAGE_CONFIG):
//   narrowQuery     the media query of a narrow screen (page.css lays the page out by the same one)
//   answerWaitMs    how long an event that takes the message box waits for the answer of the one before
//   fieldIds        the ids of the title box, the settings boxes and the backend (ChatPage.fields' order)
//   draftKeyPrefix  + a chat's id ('' for a new chat): that chat's unsent text in the browser's storage
//   newChat         what the address says for a new chat (?chat=new): a reload keeps it, and its text
//   attachedKey     the names of the files attached in the tab, in the tab's own storage
//   tabKey          a random key of the browser tab, in its own storage: the load names it (a reload's files)
//   shownChatKey    the chat the tab showed last, in the browser's storage
//   sliderDefaults  each slider's value in a new chat, by its element id (its ↺ puts it back)
//   tabClosedPath   where the page's beacon goes as its tab goes, from the page's address
//   tabSilentMs     how long a tab may send nothing before the app takes it as closed
// It sets the window.minisgl* functions that the events' own small functions (scripts.*_JS, one
// call each) run in the browser before or after their handler.
//
// Escape stops the reply, as in other chat apps (in the search box it clears the search instead);
// Enter on an empty box does nothing (Send is disabled then). In a message's edit box (✎) Enter
// saves and Shift+Enter starts a new line, as in the message box, and Escape cancels the edit.
// Enter in a settings number box saves it (it is left, as a click elsewhere does). Toasts open
// over the sidebar's bottom on a wide screen, at the screen's top on a narrow one (in the other
// half while the settings box last used shows in that one).

/* exported minisglStartPage */
function minisglStartPage(config) {
  // the stamp is an event's last input: the browser's click time (scripts.STAMP_JS)
  window.minisglStamp = (...inputs) => [...inputs.slice(0, -1), Date.now()];
  // whether a message's edit box (✎) is open: the tick leaves the chat alone then
  window.minisglEditing = () => {
    noteWhenUnanswered();
    return [!!document.querySelector('#chatbot textarea.edit-textarea')];
  };
  window.minisglTickAnswered = () => { ticks.answeredAt = Date.now(); ticks.down = false; noteWhenUnanswered(); };
  window.minisglClickDownload = () => { const a = document.querySelector('#export-file a[download]'); if (a) a.click(); };
  // "Send the first part" of files too long for the model: Send, as the user would press it
  window.minisglClickSend = () => { const send = document.querySelector('#send-btn'); if (send) send.click(); };
  // asked in the browser first; the handler gets the answer as its input
  window.minisglConfirm = (question) => [confirm(`${question} This cannot be undone.`)];
  window.minisglConfirmDeleteMessage = () => (document.querySelector('#stop-btn.stop') ? [null]
    : window.minisglConfirm('Delete this message and what follows it?'));
  const turns = takeTurnsAtTheMessageBox(config);
  keepDraftsInStorage(config, turns);
  keepTheShownChat(config);
  sayFilesDroppedByAReload(config);
  disableSendWhenEmpty();
  disableStopWhenIdle(config);
  countFieldChanges(config);
  answerKeys();
  resetSlidersToDefaults(config);
  // Import's chooser lists JSON files (Gradio's file_types would also refuse another file itself,
  // in a red "Error" toast: the app refuses it with a sentence instead, chat_files.IMPORTABLE)
  document.addEventListener('click', (e) => {
    const button = e.target instanceof Element && e.target.closest('#import-btn');
    const input = button && button.parentElement.querySelector('input[type=file]');
    if (input) input.accept = '.json,application/json';
  }, true);
  keepTypedTextTyped();
  letTheBoxGrowIntoTheChat();
  keepASwitchedMessageInView();
  bringAnEditBoxIntoView();
  messagesByKeyboard();
  nameDetailsToggles();
  placeToastsOverTheSidebar(config);
  chatListByKeyboard();
  narrowSidebar(config);
  shortPlaceholderWhenNarrow(config);
  bringPanelMessagesIntoView();
  sayWhenTheTabGoes(config);
  watchForTheApp();
}

// The app learns that a tab went from the tab itself: a beacon as the page goes (a reload, a
// close, another address), which stops the tab's replies unless a page shows them again soon
// (TabState.tab_closed). Not from Gradio's heartbeat, a stream each tab held open as long as it
// lived: the browser's six connections to the app were then all held by six tabs, and a seventh
// never loaded. A tab that sent nothing for config.tabSilentMs is taken as closed too (its browser
// froze it, or crashed): a page the app has let go (kept by the browser for Back, or frozen that
// long) reloads when shown again, as the app no longer knows what it shows.
function sayWhenTheTabGoes(config) {
  window.addEventListener('pagehide', () => {
    const session = window.__gradio_session_hash__;
    if (session) navigator.sendBeacon(config.tabClosedPath, session);
  });
  window.addEventListener('pageshow', (e) => { if (e.persisted) location.reload(); });
  let frozenAt = null;
  document.addEventListener('freeze', () => { frozenAt = Date.now(); });
  document.addEventListener('resume', () => {
    if (frozenAt !== null && Date.now() - frozenAt > config.tabSilentMs) location.reload();
    frozenAt = null;
  });
}

// The events that take the message box's text: the clicks that show another chat (a chat in the
// list, New chat, Delete, Import: the text is the draft of the chat left) and Send. Each empties
// the box at once (minisglTakeBox), and its answer says what to put back before whatever was typed
// since: the draft of the chat shown, a message refused, or nothing (ChatPage.draft_for_box, as
// JSON with the event's stamp in a hidden box: minisglApplyDraft). An answer used to set the box
// itself, wiping what had been typed meanwhile (on a busy machine: New chat, a question typed at
// once, Enter: the message was lost). These events take turns, first come first served: each
// waits for the answer to the one before (config.answerWaitMs at most; or its failure: its text
// goes back, minisglGiveBackOnFailure), takes the text, empties the box, and its answer gives
// back what goes before what was typed since (minisglGiveBack). So each reads the box as the
// answer before it left it, and the server gets them in the order they were made (Enter just
// after New chat went to the chat before). Returns the turns' state (keepDraftsInStorage waits
// for the open ones).
function takeTurnsAtTheMessageBox(config) {
  // kind: 'click' (one that shows another chat), 'send', or 'send-empty' (takes nothing).
  const turns = {last: Promise.resolve(), stamp: 0, clicks: 0, taken: new Map(), open: 0};
  window.minisglTakeBox = async (kind) => {
    const stamp = turns.stamp = Math.max(Date.now(), turns.stamp + 1);  // unique: an answer names its event by it
    const before = turns.last, afterClick = turns.clicks > 0;
    let answered;
    turns.last = new Promise((done) => { answered = done; });
    if (kind === 'click') turns.clicks += 1;
    turns.open += 1;
    let over = false;
    const end = () => { if (!over) { over = true; turns.open -= 1; if (kind === 'click') turns.clicks -= 1; answered(); } };
    await Promise.race([before, new Promise((done) => setTimeout(done, config.answerWaitMs))]);
    const box = document.querySelector('#msg-input textarea');
    const text = kind !== 'send-empty' && box ? box.value : '';
    if (text) { box.value = ''; box.dispatchEvent(new Event('input', {bubbles: true})); }
    if (kind === 'send' && text) window.minisglSaveDraft('');  // sent: no longer a draft (a refusal gives it back)
    turns.taken.set(stamp, {text, end, kind});
    setTimeout(end, config.answerWaitMs);  // an answer that never comes holds up the next no longer (a late one still gives back)
    return {stamp, text, afterClick};
  };
  // the answer to the event stamped `at` (null: the oldest one waiting, whose event failed):
  // `draft` (null: the text it took) goes before what was typed since. Written into the box
  // here, not returned for Gradio to write: the next event's turn starts at turn.end() and reads
  // the box at once, before Gradio would have written it (the text was then taken twice).
  window.minisglGiveBack = (at, draft) => {
    if (at === null) at = turns.taken.keys().next().value;
    const turn = turns.taken.get(at);
    if (!turn) return;  // an answer given back already, or an event that took nothing
    turns.taken.delete(at);
    const before = draft === null ? turn.text : draft;
    const box = document.querySelector('#msg-input textarea');
    if (box && before.trim()) {
      box.value = box.value.trim() ? `${before.trimEnd()}\n\n${box.value}` : before;
      box.dispatchEvent(new Event('input', {bubbles: true}));
      if (turn.kind === 'send') window.minisglSaveDraft(box.value);  // a message refused is a draft again
    }
    turn.end();
  };
  // a click that shows another chat: its stamp and the text it took (the draft of the chat left)
  window.minisglLeaveChat = async () => {
    const turn = await window.minisglTakeBox('click');
    return [turn.stamp, turn.text];
  };
  window.minisglLeaveChatSelect = async (chat) => [chat, ...(await window.minisglLeaveChat())];  // the chat, the stamp, the box
  window.minisglLeaveChatImport = async (file) => [file, ...(await window.minisglLeaveChat())];  // the file, the stamp, the box
  // New chat: the stamp, the box, and the settings boxes
  window.minisglLeaveChatNew = async (...inputs) => [...(await window.minisglLeaveChat()), ...inputs.slice(2)];
  // Delete chat names the chat: the selected sidebar entry's title, without its ● and time; the
  // click is its own (the stamp and the message box, emptied) when confirmed
  window.minisglConfirmDeleteChat = async (x, stamp, draft) => {
    const label = document.querySelector('#conv-list input:checked')?.closest('label');
    const title = label ? label.innerText.trim().replace(/^● /, '').replace(/ · [^·]*$/, '') : '';
    const yes = confirm((title ? `Delete the chat “${title}”?` : 'Delete this chat?') + ' This cannot be undone.');
    return yes ? [yes, ...(await window.minisglLeaveChat())] : [yes, Date.now(), draft];  // the chat shown changes
  };
  // Send: the box's text (taken once the answers before it have come: after New chat, the new
  // chat's draft and what was typed), the settings boxes, its stamp, and whether it followed a
  // click that showed another chat: its settings boxes, read at Enter, were then still those of the
  // chat before, and are not saved (ChatPage.send). Enter on an empty box takes nothing, so after
  // such a click it sends nothing, the draft coming included.
  window.minisglSend = async (...inputs) => {
    const turn = await window.minisglTakeBox(String(inputs[0] || '').trim() ? 'send' : 'send-empty');
    return [turn.text, ...inputs.slice(1, -2), turn.stamp, turn.afterClick ? 1 : 0];
  };
  // the answer of an event that took the box (ChatPage.draft_for_box: its stamp and the draft)
  window.minisglApplyDraft = (answer) => {
    const shown = answer ? JSON.parse(answer) : null;
    if (shown) window.minisglGiveBack(shown.at, shown.draft || '');
    window.minisglSentAnswered();
  };
  window.minisglGiveBackOnFailure = () => { window.minisglGiveBack(null, null); };  // the event failed: its text goes back
  return turns;
}

// The unsent text of each chat is also kept in the browser's storage (by the chat the address
// names: '' for a new chat), so that a reload, or a tab closed and opened again, finds it: the
// server keeps a tab's drafts only while the tab lives. What the user types is saved (events the
// page makes itself are not trusted: its own moves of text between chats are not saved); a
// message sent is forgotten. When the tab shows a chat (minisglRememberShownChat: the load, a
// click, New chat) and the box is empty once every answer that gives text back has come, that
// chat's stored draft goes into the box.
function keepDraftsInStorage(config, turns) {
  // by the chat the address names (the one given, else the one in the address now; a new chat: '')
  const draftKey = (chat) => {
    const named = chat ?? new URLSearchParams(location.search).get('chat');
    return `${config.draftKeyPrefix}${named === config.newChat ? '' : named || ''}`;
  };
  window.minisglSaveDraft = (text) => {
    try {
      if (text.trim()) localStorage.setItem(draftKey(), text); else localStorage.removeItem(draftKey());
    } catch { /* storage full or blocked: the tab still keeps its drafts */ }
  };
  document.addEventListener('input', (e) => {
    if (e.isTrusted && e.target instanceof Element && e.target.closest('#msg-input')) window.minisglSaveDraft(e.target.value);
  }, true);
  window.minisglRestoreDraft = async (chat) => {
    // a click on a chat changes the address before its event takes the box: let that start first
    await new Promise((done) => setTimeout(done, 300));
    for (let waited = 0; turns.open && waited < config.answerWaitMs; waited += 100) await new Promise((done) => setTimeout(done, 100));
    const box = document.querySelector('#msg-input textarea');
    const saved = localStorage.getItem(draftKey(chat));  // `chat`: the one minisglRememberShownChat put in the address
    if (!box || !saved || box.value.trim() || turns.open) return;
    if (draftKey(chat) !== draftKey()) return;  // another chat is shown by now
    box.value = saved;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  };
}

// A reload opens the chat the tab showed: the chat shown is kept in the page's address (?chat=ID,
// or ?chat=new for a new chat; replaced in place, so Back is not filled with chats) and, a saved
// one, in the browser's storage (a new tab opens the chat last saved and shown); the page's load
// asks for the one the address names (0: a new chat), else the stored one (ChatPage.load_page: the
// newest when neither exists any more; a chat the address names that is not there is said, and
// the address then names the chat shown).
function keepTheShownChat(config) {
  window.minisglAskedChats = () => {
    const id = (text) => /^\d+$/.test(text || '') ? Number(text) : null;
    const asked = new URLSearchParams(location.search).get('chat');  // -1: the address names something that is no chat id
    const inAddress = asked === null ? null : asked === config.newChat ? 0 : id(asked) ?? -1;
    return [inAddress, id(localStorage.getItem(config.shownChatKey)), browserTab()];
  };
  // the browser tab's key: the files attached before a reload wait on the server under it
  const browserTab = () => {
    try {
      let key = sessionStorage.getItem(config.tabKey);
      if (!key) {
        key = [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, '0')).join('');
        sessionStorage.setItem(config.tabKey, key);
      }
      return key;
    } catch { return ''; }  // storage blocked: a reload drops the files
  };
  window.minisglRememberShownChat = (id) => {
    const url = new URL(location.href);
    if (id !== null && id !== '' && Number.isInteger(Number(id))) {
      url.searchParams.set('chat', String(id)); localStorage.setItem(config.shownChatKey, String(id));
    }
    else { url.searchParams.set('chat', config.newChat); localStorage.removeItem(config.shownChatKey); }
    if (url.href !== location.href) history.replaceState(history.state, '', url);
    window.minisglRestoreDraft(new URLSearchParams(url.search).get('chat'));  // its unsent text, if the box has none
    return [];
  };
  // Set once the page's load has been answered and drawn (the chat list, the shown chat's
  // settings): a value typed before then is overwritten by the load's. Tests wait for it; people
  // never notice.
  window.minisglMarkLoaded = () => { document.body.dataset.chatLoaded = '1'; };
}

// The files attached wait on the server, by chat, under the browser tab's key (config.tabKey): a
// reload (a new tab to the server) finds them still attached (TabState.tab_closed, claim_files);
// an app stopped meanwhile has none. The names of the files attached (the line under the message box) are kept in the tab's
// own storage, which a reload keeps; once the reloaded page has drawn the files attached to its
// chat (minisglSayFilesDropped, after its load), those of the names that did not come back are
// said in a note under the message box (#dropped-files-note), until Dismiss or the next files
// attached.
function sayFilesDroppedByAReload(config) {
  const attached = () => document.querySelector('#attached');
  if (!attached()) {
    window.minisglSayFilesDropped ??= () => setTimeout(() => window.minisglSayFilesDropped(), 200);  // asked before it is set up
    return setTimeout(sayFilesDroppedByAReload, 200, config);
  }
  let dropped = [];
  try { dropped = JSON.parse(sessionStorage.getItem(config.attachedKey) || '[]'); } catch { /* none kept */ }
  const names = () => [...attached().querySelectorAll('code')].map((code) => code.textContent);
  const keep = () => {
    const now = names();
    try {
      if (now.length) sessionStorage.setItem(config.attachedKey, JSON.stringify(now)); else sessionStorage.removeItem(config.attachedKey);
    } catch { /* storage blocked: nothing is said after a reload */ }
    if (now.length) document.getElementById('dropped-files-note')?.remove();
  };
  new MutationObserver(keep).observe(attached(), {subtree: true, childList: true, characterData: true});
  keep();
  window.minisglSayFilesDropped = () => {
    const missing = dropped.filter((name) => !names().includes(name));
    dropped = [];
    if (!missing.length || document.getElementById('dropped-files-note')) return;
    const note = document.createElement('div');
    note.id = 'dropped-files-note';
    note.setAttribute('role', 'status');
    note.textContent = `Not kept by the reload: ${missing.join(', ')}, attached to your next message. Attach again what you still want to send. `;
    const dismiss = document.createElement('button');
    dismiss.type = 'button';
    dismiss.textContent = 'Dismiss';
    dismiss.addEventListener('click', () => note.remove());
    note.append(dismiss);
    (attached().closest('#attached-row') || attached()).after(note);
  };
}

// Send is disabled while there is nothing to send, as in other chat apps: a box empty or blank
// and no file attached (✕ Remove attachments shows while there are: files alone are a message).
// Set at each input, when Gradio writes the box (SYNC_SEND_JS) and when the page is redrawn.
function disableSendWhenEmpty() {
  window.minisglSyncSend = () => {
    const send = document.querySelector('#send-btn'), box = document.querySelector('#msg-input textarea');
    if (!send || !box) return;
    const attached = !!document.querySelector('#remove-attachments-btn')?.getClientRects().length;
    const nothing = !box.value.trim() && !attached;
    if (send.disabled !== nothing) send.disabled = nothing;
  };
  document.addEventListener('input', (e) => {
    if (e.target instanceof Element && e.target.closest('#msg-input')) window.minisglSyncSend();
  }, true);
}

// Stop is disabled while the chat shown has nothing to stop: it is pressable while the page
// marks it red (.stop: the chat replies or its prompt is being read, Rendering.render), and from
// a message's Enter (or ↻, Continue) until the page has drawn what the server made of it, so that
// a Stop pressed before the reply is drawn still stops it (Composer.stop, by its stamp). Set at
// each change of its class, when Gradio draws it anew, and when that grace ends.
function disableStopWhenIdle(config) {
  const AFTER_ANSWER_MS = 3000, AFTER_CLICK_MS = 5000;  // the follow that draws the reply comes after the answer
  let graceUntil = 0, watched = null;
  const sync = () => {
    const stop = document.querySelector('#stop-btn');
    if (!stop) return;
    if (stop !== watched) {
      watched = stop;
      new MutationObserver(sync).observe(stop, {attributes: true, attributeFilter: ['class']});
    }
    const replying = stop.classList.contains('stop');
    if (replying) graceUntil = 0;
    const idle = !replying && Date.now() >= graceUntil;
    if (stop.disabled !== idle) stop.disabled = idle;
  };
  const graceFor = (ms) => {
    graceUntil = Date.now() + ms;
    sync();
    setTimeout(sync, ms + 50);
  };
  window.minisglSyncStop = sync;
  window.minisglSentAnswered = () => { if (graceUntil > Date.now() + AFTER_ANSWER_MS) graceFor(AFTER_ANSWER_MS); };
  const sends = () => !unreachable() && (!!document.querySelector('#msg-input textarea')?.value.trim()
    || !!document.querySelector('#remove-attachments-btn')?.getClientRects().length);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.target instanceof Element && e.target.closest('#msg-input') && sends()) graceFor(config.answerWaitMs);
  }, true);
  document.addEventListener('click', (e) => {
    if (!(e.target instanceof Element)) return;
    if (e.target.closest('#send-btn') && sends()) graceFor(config.answerWaitMs);
    if (e.target.closest('#continue-btn, #chatbot button[aria-label="Retry"]')) graceFor(AFTER_CLICK_MS);
  }, true);
  sync();
}

// The title and settings boxes (config.fieldIds): how often the user changed each (typing,
// pasting, a click or a pick; Rename counts for the title), as each redraw of them was asked
// (minisglFocusedField, by the redraw's number; the first ask of a number counts: Gradio may send
// one change twice); a redraw answered after such a change leaves that box to the user
// (minisglApplyRedrawnFields).
function countFieldChanges(config) {
  const fieldIds = config.fieldIds, fieldChanges = {counts: new Map(), asked: new Map()};
  const countFieldChange = (e) => {
    if (!(e.target instanceof Element)) return;
    // a pick in the backend's list is a click (Gradio's dropdown sends no input event)
    const id = e.type !== 'click' ? fieldIds.find((id) => e.target.closest(`#${id}`))
      : e.target.closest('#rename-btn') ? 'title-input' : e.target.closest('#backend') ? 'backend' : null;
    if (id) fieldChanges.counts.set(id, (fieldChanges.counts.get(id) ?? 0) + 1);
  };
  for (const type of ['input', 'change', 'click']) document.addEventListener(type, countFieldChange, true);
  window.minisglFieldsAsked = (n) => {
    if (!fieldChanges.asked.has(Number(n))) fieldChanges.asked.set(Number(n), new Map(fieldChanges.counts));
    for (const old of fieldChanges.asked.keys()) if (old < Number(n) - 100) fieldChanges.asked.delete(old);  // long answered
  };
  window.minisglFieldChangedSince = (n, id) => {
    const asked = fieldChanges.asked.get(Number(n));
    return asked !== undefined && (fieldChanges.counts.get(id) ?? 0) > (asked.get(id) ?? 0);
  };
  // A redraw of the boxes (after a change elsewhere) is asked now, with its number n, and
  // answered later. Asked: which box has the keyboard's focus (''), which the redraw leaves.
  window.minisglFocusedField = (n) => {
    window.minisglFieldsAsked(n);
    return [n, fieldIds.find((id) => document.getElementById(id)?.contains(document.activeElement)) || ''];
  };
  // Answered (ChatPage.redraw_boxes: JSON with the redraw's number and the boxes' new values, in a
  // hidden box): each value goes into its box only if the user has not changed that box since the
  // redraw was asked. Written by Gradio, the answer overwrote what was typed in that moment (a
  // title typed just after the ask went back to the old one, and Rename renamed the chat to it;
  // the same for a settings box clicked into after the ask). {__type__: 'update'} is Gradio's
  // skip: the box is left as it is. Asked through window, where a test may watch it.
  window.minisglApplyRedrawnFields = (answer) => {
    const keep = {__type__: 'update'};
    if (!answer) return [...fieldIds.map(() => keep), keep];
    const {n, values} = JSON.parse(answer);
    const changed = (id) => window.minisglFieldChangedSince(n, id);
    return [...fieldIds.map((id) => id in values && !changed(id) ? values[id] : keep), ''];
  };
}

// Escape, Enter and the arrows where the page gives them a meaning of its own (see the top)
function answerKeys() {
  document.addEventListener('keydown', (e) => {
    if (e.target instanceof Element && e.target.matches('#chatbot textarea.edit-textarea')) {
      const button = (label) => document.querySelector(`#chatbot button[aria-label="${label}"]`);
      const save = e.key === 'Enter' && !e.shiftKey && !e.isComposing && button('Submit');
      const cancel = e.key === 'Escape' && button('Cancel');
      if (save || cancel) { e.preventDefault(); e.stopPropagation(); (save || cancel).click(); }
      return;
    }
    // Escape in the search box clears the search (the reply goes on); anywhere else it stops the reply
    if (e.key === 'Escape' && e.target instanceof Element && e.target.matches('#search textarea, #search input')) {
      if (e.target.value) { e.preventDefault(); e.target.value = ''; e.target.dispatchEvent(new Event('input', {bubbles: true})); }
      return;
    }
    if (e.key === 'Escape') { const b = document.querySelector('#stop-btn'); if (b) b.click(); }
    // a settings box is saved when left: Enter in a number box leaves it (a slider's too)
    if (e.key === 'Enter' && e.target instanceof Element && e.target.matches('#settings input[type=number]')) {
      e.preventDefault(); e.target.blur();
    }
  }, true);
  // a settings number box shows the number it holds (the value saved): "1e3" is saved as 1000
  // and showed "1e3" (the page's value did not change, so Gradio left the text as typed)
  document.addEventListener('change', (e) => {
    const box = e.target;
    if (box instanceof HTMLInputElement && box.matches('#settings input[type=number]') && box.value !== ''
        && Number.isFinite(box.valueAsNumber) && String(box.valueAsNumber) !== box.value) box.value = String(box.valueAsNumber);
  }, true);
  // a slider moved with the keyboard is saved when the key is let go, as a drag is (Gradio
  // sends a slider's release on pointerup only)
  document.addEventListener('keyup', (e) => {
    if (e.target instanceof Element && e.target.matches('#settings input[type=range]')
        && ['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown', 'PageUp', 'PageDown', 'Home', 'End'].includes(e.key)) {
      e.target.dispatchEvent(new PointerEvent('pointerup'));
    }
  }, true);
  // A slider's number box left: its value is sent as typed (a pointerup, which Gradio turns into
  // the slider's release), and Gradio's own blur handler is kept from running. That handler sends
  // the value and then clamps the box into the slider's range: the clamped value (top-p 7 → 1)
  // went to the server with the next event reading the box and was saved, while the toast said
  // the typed value was refused.
  document.addEventListener('blur', (e) => {
    const box = e.target;
    if (!(box instanceof HTMLInputElement) || !box.matches('#settings input[type=number]')) return;
    const slider = box.closest('.block');
    if (!slider || !slider.querySelector('input[type=range]')) return;
    e.stopImmediatePropagation();
    box.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  }, true);
}

// The tick asks the server once a second (Ticks.wire_tick). Unanswered for UNANSWERED_MS, the
// page says it cannot reach the app, in a note over the status line, instead of waiting without
// a word: the browser's six connections to one host may all be held by other tabs of the app (a
// tab's event stream holds one while its events run), or the app stopped. Read at each tick
// asked (minisglEditing) and answered (minisglTickAnswered), and once a second on its own: once
// the app had stopped, Gradio asked no more ticks, and the note never showed. A hidden tab's
// ticks are held back by the browser: a tab shown again waits a moment for one before it speaks.
// While the app cannot be reached, Enter and Send in the message box send nothing (Gradio emptied
// the box and the message went nowhere): the note says so, and the message stays in the box.
// A busy app answers a tick late, so the note waited 8 s: for those 8 s only Gradio's toast said
// the connection was lost, and a message sent then was lost without a word. Two seconds without
// an answer, the page asks the app for its icon: refused (the app stopped), it says so at once.
const UNANSWERED_MS = 8000, SHOWN_AGAIN_MS = 3000, PROBE_AFTER_MS = 2000;
const ticks = {answeredAt: Date.now(), shownAt: Date.now(), refused: false, down: false, probing: false};
function unreachable() {
  const now = Date.now();
  return !document.hidden && (ticks.down || (now - ticks.answeredAt > UNANSWERED_MS && now - ticks.shownAt > SHOWN_AGAIN_MS));
}
function probeTheApp() {
  if (document.hidden || ticks.probing || Date.now() - ticks.answeredAt < PROBE_AFTER_MS) return;
  ticks.probing = true;
  // any answer, even an error page, is the app's; only a failed connection means it is gone
  fetch(new URL('/favicon.ico', location.origin), {method: 'HEAD', cache: 'no-store'})
    .then(() => { ticks.down = false; }, () => { ticks.down = true; })
    .finally(() => { ticks.probing = false; noteWhenUnanswered(); });
}
function noteWhenUnanswered() {
  let note = document.getElementById('unreachable-note');
  const cut = unreachable();
  // the status line's last figures ("Ready · 0 running") are stale: page.css shows "Not connected"
  document.getElementById('status-line')?.classList.toggle('app-unreachable', cut);
  if (!cut) { if (note) note.hidden = true; ticks.refused = false; return; }
  if (!note) {
    note = document.createElement('div');
    note.id = 'unreachable-note';
    note.setAttribute('role', 'alert');
    document.body.append(note);
  }
  const text = 'The page cannot reach the app: it may have stopped, or other tabs of it '
    + 'hold all of this browser\'s connections to it (close one). Waiting…'
    + (ticks.refused ? ' Your message was not sent: it stays in the box.' : '');
  if (note.textContent !== text) note.textContent = text;
  note.hidden = false;
}
function watchForTheApp() {
  setInterval(() => { noteWhenUnanswered(); probeTheApp(); }, 1000);
  document.addEventListener('visibilitychange', () => { if (!document.hidden) ticks.shownAt = Date.now(); });
  const refuse = (e) => {
    if (!unreachable()) return;
    e.preventDefault(); e.stopImmediatePropagation();
    ticks.refused = true;
    noteWhenUnanswered();
  };
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.target instanceof Element && e.target.closest('#msg-input')) refuse(e);
  }, true);
  document.addEventListener('click', (e) => { if (e.target instanceof Element && e.target.closest('#send-btn')) refuse(e); }, true);
}

// A slider's ↺ puts in the value a new chat starts with, and saves it as a value typed is.
// Gradio's own ↺ puts back the value the slider had when it was first drawn: the value of the
// chat shown then, which it saved to whichever chat is shown now.
function resetSlidersToDefaults(config) {
  document.addEventListener('click', (e) => {
    const button = e.target instanceof Element && e.target.closest('#settings button[data-testid=reset-button]');
    const slider = button && button.closest('.block[id]');
    if (!slider || !(slider.id in config.sliderDefaults)) return;
    e.stopImmediatePropagation(); e.preventDefault();
    const box = slider.querySelector('input[type=number]');
    box.value = String(config.sliderDefaults[slider.id]);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    box.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  }, true);
}

// HTML in a message is shown as text by a mark after its "<" (view.shown_literally), an image as
// a link whose alt text is between two marks (U+2062), inline math between two marks (U+2063), a
// numbered line's number as written by an empty comment on the line before it (view.LIST_BREAK):
// what is copied (Copy, a code block's copy, a selection) is the text as typed, without the marks
// (view.typed_text), and a message's accessible name has none of them
function keepTypedTextTyped() {
  const unmark = (text) => String(text).replace(/\[🖼 \u2062([^\u2062]*)\u2062[^\]\u2062]*\]\(/g, '![$1](')
    .replace(/\n[ \t]*<!---->\n\n/g, '').replace(/([<&!])\u2060/g, '$1').replace(/\u2063/g, '');
  const hasMarks = /[<&!]\u2060|[\u2062\u2063]|\n[ \t]*<!---->\n\n/;
  if (navigator.clipboard && navigator.clipboard.writeText) {
    const write = navigator.clipboard.writeText.bind(navigator.clipboard);
    navigator.clipboard.writeText = (text) => write(unmark(text));
  }
  document.addEventListener('copy', (e) => {
    const box = document.activeElement;
    const text = box && 'selectionStart' in box && typeof box.value === 'string'
      ? box.value.slice(box.selectionStart, box.selectionEnd) : String(getSelection());
    if (hasMarks.test(text) && e.clipboardData) { e.clipboardData.setData('text/plain', unmark(text)); e.preventDefault(); }
  }, true);
  // ✓ (or Enter) in an edit box: Gradio shows the edited text as Markdown at once, before the
  // page's answer redraws it as typed, so an <img src=x> typed there would be fetched. The
  // box's text is marked first as the page shows it (view.shown_literally's marks: ✎ saves the
  // text as typed, view.typed_text)
  const markTyped = (text) => String(text).replace(/<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)/g, '$&\u2060')
    .replace(/!\[/g, '!\u2060[');
  document.addEventListener('click', (e) => {
    if (!(e.target instanceof Element) || !e.target.closest('#chatbot button[aria-label="Submit"]')) return;
    for (const box of document.querySelectorAll('#chatbot textarea.edit-textarea')) {
      const marked = markTyped(box.value);
      if (marked !== box.value) { box.value = marked; box.dispatchEvent(new Event('input', {bubbles: true})); }
    }
  }, true);
  // a message's edit box (✎) holds the text as typed: Gradio fills it with the text as shown, marks
  // and all, where each took a key press of its own to cross (invisible), and a "<" deleted left its
  // mark in the message saved
  const unmarkEditBoxes = () => {
    for (const box of document.querySelectorAll('#chatbot textarea.edit-textarea')) {
      if (!hasMarks.test(box.value)) continue;
      box.value = unmark(box.value);
      box.dispatchEvent(new Event('input', {bubbles: true}));  // Gradio's copy of the box's text follows
    }
  };
  watchTheChat(unmarkEditBoxes);
  // Gradio names each message by its text (aria-label, read by a screen reader): the marks,
  // invisible on the screen, were in it; they are taken out of the chat's names and titles
  const unmarkNames = () => {
    for (const e of document.querySelectorAll('#chatbot [aria-label], #chatbot [title]')) {
      for (const name of ['aria-label', 'title']) {
        const value = e.getAttribute(name);
        if (value && /[\u2060\u2062\u2063]/.test(value)) e.setAttribute(name, value.replace(/[\u2060\u2062\u2063]/g, ''));
      }
    }
  };
  watchTheChat(unmarkNames);
}

// The message box grows with its text into the chat above it (page.css): what it takes beyond
// its least height (one line) is kept in --box-grown, which the chat's height gives up on a
// narrow screen, so the page keeps to the window (on a wide one the chat takes what the column's
// other rows leave)
function letTheBoxGrowIntoTheChat() {
  const box = document.querySelector('#msg-input textarea');
  if (!box) return setTimeout(letTheBoxGrowIntoTheChat, 200);
  new ResizeObserver(() => {
    if (!box.offsetHeight) return;  // not shown
    const least = parseFloat(getComputedStyle(box).minHeight) || 0;
    const grown = Math.max(0, box.offsetHeight - least);
    document.documentElement.style.setProperty('--box-grown', `${grown}px`);
  }).observe(box);
}

// ‹ › keep the message whose version changed where it was in the chat: the chat, drawn anew with
// the other version's turns below it, followed its new end (Gradio scrolls a chat that was at its
// end to the end), and the message went off the screen. The versions bar names the message ("Your
// message 7", "Reply 7": the 7th of its kind in the chat); for a moment after the click, each
// scroll or redraw of the chat puts it back where it was (higher, as far as a longer version needs
// to be seen whole, its top kept in view), until the user scrolls or clicks. What is
// held is the message's row (Gradio draws each message and each line under one as a row of its
// own): the rows above it, the turns before it, are the same in either version. A reply stopped
// before its first word shows only its line, and a bubble counted by kind missed it (the chat then
// jumped to its new end): the row clicked to pick the message stands in for it then. A chat shown
// in part (its first messages behind "Show N earlier messages") is left alone: its bubbles do not
// count from the chat's first message.
function keepASwitchedMessageInView() {
  const HOLD_MS = 10000;  // the chat may take seconds to be drawn anew on a busy machine
  const switchers = '#prev-version-btn, #next-version-btn';
  let held = null;  // {row: its index among the chat's rows, top: its top below the chat's visible top, until}
  let picked = null;  // {kind, row}: the row last clicked in the chat (a click, or Enter on a message)
  const scroller = () => document.querySelector('#chatbot .bubble-wrap');
  const rows = () => [...document.querySelectorAll('#chatbot .message-row')];
  const rowOf = ({kind, n}) => {
    const bubble = document.querySelectorAll(`#chatbot [data-testid='${kind}']:not(:has(.thought-group))`)[n - 1];
    const row = bubble ? rows().indexOf(bubble.closest('.message-row')) : -1;
    return row >= 0 ? row : picked?.kind === kind ? picked.row : -1;
  };
  const topIn = (message, box) => message.getBoundingClientRect().top - box.getBoundingClientRect().top;
  document.addEventListener('click', (e) => {
    const row = e.target instanceof Element && e.target.closest('#chatbot .message-row');
    const kind = row && row.querySelector("[data-testid='user'], [data-testid='bot']")?.dataset.testid;
    if (kind) picked = {kind, row: rows().indexOf(row)};
  }, true);
  document.addEventListener('click', (e) => {
    if (!(e.target instanceof Element) || !e.target.closest(switchers)) return;
    const named = /^(Your message|Reply) (\d+)/.exec((document.querySelector('#versions-label')?.innerText || '').trim());
    const box = scroller();
    held = null;
    if (!named || !box || document.querySelector('#chatbot .earlier-line')) return;
    const row = rowOf({kind: named[1] === 'Reply' ? 'bot' : 'user', n: Number(named[2])});
    if (row >= 0) held = {row, top: topIn(rows()[row], box), until: Date.now() + HOLD_MS};
  }, true);
  const keep = () => {
    if (held && Date.now() > held.until) held = null;
    const box = held && scroller(), message = box && rows()[held.row];
    if (!message) return;
    let drift = topIn(message, box) - held.top;
    // held where it was, it would end below the chat's end (a longer version): it goes up as far as
    // it must to be seen whole, its top kept in view
    const over = message.getBoundingClientRect().bottom - drift - box.getBoundingClientRect().bottom;
    if (over > 1) { const lift = Math.min(over, held.top); held.top -= lift; drift += lift; }
    if (Math.abs(drift) > 1) box.scrollTop += drift;
  };
  const letGo = (e) => { if (!(e.target instanceof Element && e.target.closest(switchers))) held = null; };
  for (const type of ['wheel', 'touchstart', 'keydown', 'pointerdown']) addEventListener(type, letGo, true);
  document.addEventListener('scroll', keep, true);
  watchTheChat(keep);
}

// ✎ opens a message's edit box where the message was: for a long message scrolled up until only
// its ✎ showed at the chat's top, that was above the chat's visible part, under the status line.
// An edit box that opens is brought into the chat's view, its top first.
function bringAnEditBoxIntoView() {
  let shown = null;
  watchTheChat(() => {
    const box = document.querySelector('#chatbot textarea.edit-textarea');
    if (box && box !== shown) box.scrollIntoView({block: 'nearest'});
    shown = box;
  });
}

// Messages by keyboard: Gradio draws a message as a clickable bubble that takes no focus, so the
// versions bar (‹ ›, Delete message), which acts on the message picked, was out of the keyboard's
// reach; and each of a message's buttons was a Tab stop of its own (five for a reply: Copy, Edit,
// its figures' ▸, ↻). A message is one Tab stop (page.css rings it); Enter or Space picks it, as a
// click does; → and ← go through its actions (the buttons in it and under it, the lines under it
// included, until the next message), Home back to it; ↑ ↓ go to the message before and after. The
// buttons of an edit box (✎) keep their Tab stops, and so does a line above every message.
function messagesByKeyboard() {
  const MESSAGES = "#chatbot [data-testid='user'], #chatbot [data-testid='bot']";
  const isMessage = (e) => e instanceof Element && e.matches(MESSAGES) && !e.querySelector('.thought-group');
  const messages = () => [...document.querySelectorAll(MESSAGES)].filter(isMessage);
  const rowOf = (message) => message.closest('.message-row');
  // the message's buttons, in order: in its bubble (a code block's Copy), then under it, to the next message
  // (a line's title is a button of Gradio's too, holding its ▸: the ▸ stands for it)
  const ACTIONS = 'button, [role=button]';
  const focusables = (message) => {
    const found = [...message.querySelectorAll(ACTIONS)];
    for (let e = rowOf(message)?.nextElementSibling; e && !(e.matches('.message-row') && messages().some((m) => rowOf(m) === e)); e = e.nextElementSibling)
      found.push(...e.querySelectorAll(ACTIONS));
    return found.filter((b) => !b.matches('[aria-label="Submit"], [aria-label="Cancel"]'));
  };
  const actionsOf = (message) => focusables(message).filter((b) => !b.querySelector('button'));
  const ownerOf = (button) => messages().find((m) => actionsOf(m).includes(button));
  watchTheChat(() => {
    for (const message of messages()) {
      if (message.tabIndex !== 0) message.tabIndex = 0;
      for (const b of focusables(message)) if (b.tabIndex !== -1) b.tabIndex = -1;
    }
  });
  const shown = (b) => !b.disabled && b.getClientRects().length > 0;
  document.addEventListener('keydown', (e) => {
    if (e.altKey || e.ctrlKey || e.metaKey || !(e.target instanceof Element) || !e.target.closest('#chatbot')) return;
    const message = isMessage(e.target) ? e.target : e.target.matches(ACTIONS) ? ownerOf(e.target) : null;
    if (!message) return;
    const go = (to) => { if (to) { e.preventDefault(); to.focus(); } };
    if (e.target === message && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); message.click(); return; }
    if (e.target === message && (e.key === 'ArrowUp' || e.key === 'ArrowDown')) {
      const all = messages();
      go(all[all.indexOf(message) + (e.key === 'ArrowUp' ? -1 : 1)]);
      return;
    }
    const toggle = e.target !== message && e.target.parentElement?.closest('[role=button]');
    if (toggle && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); e.stopPropagation(); toggle.click(); return; }  // a line's ▸
    const actions = actionsOf(message).filter(shown), at = actions.indexOf(e.target);
    if (e.key === 'ArrowRight') go(actions[at + 1]);
    else if (e.key === 'ArrowLeft') go(at > 0 ? actions[at - 1] : at === 0 ? message : null);
    else if (e.key === 'Home' && e.target !== message) go(message);
    else if (e.key === 'End') go(actions[actions.length - 1]);
  }, true);
}

// The ▸ of a line under a message (a reply's figures, a version, its thinking) opens its details;
// Gradio draws it as a button with an empty name: it is named, and its line says whether it is open.
function nameDetailsToggles() {
  const nameToggles = () => {
    for (const b of document.querySelectorAll('#chatbot .thought-group .title .arrow button')) {
      const open = (b.closest('.arrow').style.transform || '').includes('180');
      const name = open ? 'Hide details' : 'Show details';
      if (b.getAttribute('aria-label') !== name) { b.setAttribute('aria-label', name); b.setAttribute('title', name); }
      const title = b.closest('.title');
      if (title.getAttribute('aria-expanded') !== String(open)) title.setAttribute('aria-expanded', String(open));
    }
  };
  watchTheChat(nameToggles);
}

// `changed` now and at each change of the chat's messages (Gradio draws the chat after the
// page's script has run: it is looked for until it is there)
function watchTheChat(changed) {
  const chat = document.querySelector('#chatbot');
  if (!chat) return setTimeout(watchTheChat, 200, changed);
  new MutationObserver(changed).observe(chat, {subtree: true, childList: true, attributes: true, attributeFilter: ['style', 'aria-label']});
  changed();
}

// Toasts open at the bottom of the sidebar, as wide as it, on a wide screen, clear of the chat's
// messages and of the message box; on a narrow screen (config.narrowQuery) at the screen's top, over
// the bar of ☰ Chats and the status line. A toast about a settings box covered it there (Max tokens
// refused, at 1280x800: the toast over the box and the value put back in it): while the box last
// used in the sidebar shows in the half of the screen where toasts open, they open in the other
// half (the sidebar's top, the screen's bottom). Their place is kept in --mc-toast-top,
// --mc-toast-bottom, --mc-toast-left and --mc-toast-width (page.css), as the window, the sidebar
// or that box's place changes.
function placeToastsOverTheSidebar(config) {
  const sidebar = document.querySelector('#sidebar');
  if (!sidebar) return setTimeout(placeToastsOverTheSidebar, 200, config);
  let field = null;  // the box last used in the sidebar
  const fieldBox = () => (field?.isConnected && field.getClientRects().length ? field.getBoundingClientRect() : null);
  const placed = {};
  const place = () => {
    const box = sidebar.getBoundingClientRect(), gap = parseFloat(getComputedStyle(sidebar).paddingRight) || 0;
    const wide = !matchMedia(config.narrowQuery).matches && box.width > 0;
    const used = fieldBox(), middle = innerHeight / 2;
    const low = wide ? !(used && used.bottom > middle) : !!(used && used.top < middle);  // at the bottom
    const vars = {top: low ? 'auto' : wide ? '16px' : '4px', bottom: !low ? 'auto' : wide ? '16px' : '4px',
      ...(wide ? {left: `${Math.max(0, box.left)}px`, width: `${Math.max(0, box.width - gap)}px`}
        : {left: '12px', width: 'calc(100vw - 24px)'})};
    for (const [name, value] of Object.entries(vars)) {
      if (placed[name] !== value) document.documentElement.style.setProperty(`--mc-toast-${name}`, value);
      placed[name] = value;
    }
  };
  document.addEventListener('focusin', (e) => {
    if (e.target instanceof Element && e.target.matches('#sidebar input, #sidebar textarea')) { field = e.target; place(); }
  }, true);
  document.addEventListener('scroll', () => { if (field) place(); }, true);  // the box moved with what scrolled
  new ResizeObserver(place).observe(sidebar);
  addEventListener('resize', place);
  place();
}

// A long title in the chat list is cut with "…" before its time, which stays in view (page.css: .chat-when),
// and in its middle: its last words stay in view too, so chats whose titles start alike
// ("Can you explain how the Python…") do not look the same. Gradio writes the label, "title ·
// time", into one text node of its span. That node (Gradio writes a changed label into it
// again) is kept and moved into .chat-head, in .chat-title; the time goes into .chat-when:
// the label's text stays "title · time"
function splitTime(label) {
  const span = label.querySelector(':scope > span');
  const text = span && (span.querySelector(':scope > .chat-title > .chat-head') || span).firstChild;
  if (!text || text.nodeType !== Node.TEXT_NODE || (text.nodeValue === span.dataset.head && span.querySelector('.chat-when'))) return;
  const full = text.nodeValue, at = full.lastIndexOf(' · ');
  if (at < 0) return;
  let title = span.querySelector(':scope > .chat-title'), when = span.querySelector(':scope > .chat-when');
  if (!title) {
    title = document.createElement('span'); title.className = 'chat-title'; span.insertBefore(title, text);
    const head = document.createElement('span'); head.className = 'chat-head'; title.appendChild(head); head.appendChild(text);
    const tail = document.createElement('span'); tail.className = 'chat-tail'; title.appendChild(tail);
  }
  if (!when) { when = document.createElement('span'); when.className = 'chat-when'; span.appendChild(when); }
  span.dataset.title = span.dataset.head = text.nodeValue = full.slice(0, at);
  title.querySelector(':scope > .chat-tail').textContent = '';
  delete span.dataset.fitted;
  when.textContent = full.slice(at);
  label.style.setProperty('--when', `${full.length - at + 1}ch`);
  label.title = full.slice(0, at).replace(/^● /, '');
}

// a replying chat's ● is no part of its title
function unmarked(title) { return title.replace(/^● /, ''); }

// for each title, how many of its first characters it shares with another title of the list
function sharedBeginnings(titles) {
  const order = titles.map((title, i) => [unmarked(title), i]).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const shared = titles.map(() => 0);
  for (let k = 1; k < order.length; k++) {
    const [a, i] = order[k - 1], [b, j] = order[k];
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    shared[i] = Math.max(shared[i], n); shared[j] = Math.max(shared[j], n);
  }
  return shared;
}

// a title's last words that fit in `room` (its last characters if no word fits)
function lastWords(title, room, widthOf) {
  for (let at = title.indexOf(' ', 1); at > 0; at = title.indexOf(' ', at + 1))
    if (widthOf(title.slice(at)) <= room) return title.slice(at);
  let end = '';
  for (const char of [...title].reverse()) {
    if (widthOf(char + end) > room) break;
    end = char + end;
  }
  return end;
}

// what of a title too long for its row stays in view after its "…" (fitTitles)
function tailOf(whole, shared, room, widthOf) {
  const differs = whole.length - unmarked(whole).length + shared;  // the first character no other title has there
  if (differs >= whole.length || widthOf(whole.slice(0, differs + 1) + '…') <= 0.55 * room)
    return lastWords(whole, 0.45 * room, widthOf);  // shown by the head, or no title shares its beginning
  const word = whole.lastIndexOf(' ', differs);
  return whole.slice(word > 0 ? word : differs);
}

// A title too long for its row keeps in view, in .chat-tail after the "…" of .chat-head, what
// tells it from the other titles: from the word where it stops sharing its beginning with any
// of them, when that lies beyond what the head shows ("Can you explain h… case 7 of…"), else
// its last words ("… weak references?"); at most 45% of the row's room for the title, cut with
// "…" beyond. Fitted once the list is shown (☰ Chats on a phone), and again when its width, its
// font (the chat shown is bold) or the other titles change. Each row's room and font are read
// first, for all rows at once, and text is measured on a canvas: measured in the page, row by
// row, 300 chats took 7 s to fit (a layout for each width tried)
function fitTitles(labels, ruler) {  // ruler: a canvas's 2d context
  const shared = sharedBeginnings([...labels].map((label) => label.querySelector(':scope > span')?.dataset.title || ''));
  const unfitted = [];
  labels.forEach((label, i) => {
    const span = label.querySelector(':scope > span'), head = span?.querySelector(':scope > .chat-title > .chat-head');
    const tail = head?.nextElementSibling, when = span?.querySelector(':scope > .chat-when');
    if (!tail || !when || !span.clientWidth) return;
    const whenWidth = Math.ceil(when.getBoundingClientRect().width), room = span.clientWidth - whenWidth;
    const font = getComputedStyle(head).font, fitted = `${room} ${shared[i]} ${font} ${span.dataset.title}`;
    if (span.dataset.fitted !== fitted) unfitted.push({label, span, head, tail, whenWidth, room, font, fitted, shared: shared[i]});
  });
  for (const {label, span, head, tail, whenWidth, room, font, fitted, shared} of unfitted) {
    ruler.font = font;
    const widthOf = (text) => ruler.measureText(text).width, whole = span.dataset.title;
    const end = widthOf(whole) > room ? tailOf(whole, shared, room, widthOf) : '';
    span.dataset.head = head.firstChild.nodeValue = whole.slice(0, whole.length - end.length);
    tail.textContent = end;
    label.style.setProperty('--when', `${whenWidth}px`);  // measured: in ch it was a guess
    // none: the title fits whole; cut beyond 45% of the room
    label.style.setProperty('--tail', end ? `${Math.ceil(Math.min(widthOf(end) + 1, 0.45 * room))}px` : '0px');
    span.dataset.fitted = fitted;
  }
}

// The chat list by keyboard: Gradio hides each chat's radio, and a label takes no focus. Each
// chat takes focus (Tab), Enter or Space opens it, ↑ ↓ move between chats; the label says whether
// it is the chat shown (its radio, hidden, says nothing to a screen reader). Its titles are fitted
// to their rows (fitTitles).
function chatListByKeyboard() {
  const list = document.querySelector('#conv-list');
  if (!list) return setTimeout(chatListByKeyboard, 200);
  const ruler = document.createElement('canvas').getContext('2d');
  // the list scrolls on its own (page.css: #conv-list's .wrap): when the chat shown changes (a
  // click, a reload, another chat opened by its address) it is brought into the list's view, once
  // the list is shown (a phone's closed list has no size yet); the user's own scrolling is left alone
  let inView = null;
  const keepShownInView = () => {
    const input = list.querySelector('input:checked'), box = list.querySelector(':scope > .wrap:has(> label)');
    if (!input || !box || !box.clientHeight || input.value === inView) return;
    inView = input.value;
    const row = input.closest('label').getBoundingClientRect(), view = box.getBoundingClientRect();
    if (row.top < view.top) box.scrollTop -= view.top - row.top;
    else if (row.bottom > view.bottom) box.scrollTop += row.bottom - view.bottom;
  };
  const mark = () => {
    const labels = list.querySelectorAll('label');
    for (const label of labels) {
      splitTime(label);
      if (label.tabIndex !== 0) label.tabIndex = 0;
      const shown = String(!!label.querySelector('input:checked'));
      if (label.getAttribute('role') !== 'radio') label.setAttribute('role', 'radio');
      if (label.getAttribute('aria-checked') !== shown) label.setAttribute('aria-checked', shown);
    }
    fitTitles(labels, ruler);
    keepShownInView();
  };
  new MutationObserver(mark).observe(list, {subtree: true, childList: true, characterData: true, attributes: true,
                                          attributeFilter: ['class']});
  new ResizeObserver(mark).observe(list);  // shown (☰ Chats on a phone) or resized: the titles are fitted again
  const refit = () => { for (const span of list.querySelectorAll('label > span')) delete span.dataset.fitted; mark(); };
  document.fonts.addEventListener('loadingdone', refit);  // a font loaded later (the bold one) changed every width
  document.fonts.ready.then(refit);
  list.addEventListener('transitionend', mark);  // the chat shown turns bold gradually: its widths are final at the end
  mark();
  list.addEventListener('keydown', (e) => {
    const label = e.target instanceof Element && e.target.closest('#conv-list label');
    if (!label) return;
    if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); label.click(); return; }
    const step = {ArrowDown: 1, ArrowUp: -1}[e.key];
    const labels = [...list.querySelectorAll('label')];
    const next = step && labels[labels.indexOf(label) + step];
    if (next) { e.preventDefault(); next.focus(); }
  });
}

// The message box's placeholder names Enter and Shift+Enter: on a narrow screen (config.narrowQuery)
// it was cut after "Shift+Ent" (a phone's keyboard has no Shift+Enter anyway). It says only
// "Message" there, and the whole of it again when the window widens.
function shortPlaceholderWhenNarrow(config) {
  const field = document.querySelector('#msg-input'), first = field?.querySelector('textarea');
  if (!first) return setTimeout(shortPlaceholderWhenNarrow, 200, config);
  const whole = first.placeholder, narrow = matchMedia(config.narrowQuery);
  const fit = () => {
    const box = field.querySelector('textarea'), wanted = narrow.matches ? 'Message' : whole;
    if (box && box.placeholder !== wanted) box.placeholder = wanted;
  };
  narrow.addEventListener('change', fit);
  new MutationObserver(fit).observe(field, {subtree: true, childList: true, attributes: true, attributeFilter: ['placeholder']});  // a box drawn anew
  fit();
}

// On a narrow screen (config.narrowQuery) the sidebar is a bar above the chat (page.css): ☰ Chats
// opens the chat list, the settings and the models under it; a chat picked there (or New chat)
// closes them, and the page shows the chat from the top (its aria-expanded says whether they are
// open; the page's CSS reads it). A pick made by keyboard (a click of detail 0) that hid the
// focused label moves the focus to the message box, a tap's to ☰ Chats (a message box focused
// would open a phone's keyboard): not to <body>.
function narrowSidebar(config) {
  const toggle = () => document.querySelector('#chats-toggle');
  let chatsOpen = false;
  const markChatsToggle = () => {
    const t = toggle();
    if (!t) return;
    for (const [name, value] of [['aria-expanded', String(chatsOpen)], ['aria-controls', 'sidebar-body'], ['aria-label', 'Chats']])
      if (t.getAttribute(name) !== value) t.setAttribute(name, value);
  };
  const setOpen = (open) => { chatsOpen = open; markChatsToggle(); };
  document.addEventListener('click', (e) => {
    const target = e.target instanceof Element ? e.target : null;
    if (target?.closest('#chats-toggle')) { setOpen(!chatsOpen); return; }
    const picked = target?.closest('#conv-list label, #new-chat-btn');
    if (!picked || !matchMedia(config.narrowQuery).matches) return;
    setOpen(false);
    scrollTo({top: 0, behavior: 'instant'});
    if (document.querySelector('#sidebar-body')?.contains(document.activeElement))
      (e.detail === 0 ? document.querySelector('#msg-input textarea') : toggle())?.focus({preventScroll: true});
  });
  // set again whenever Gradio draws the button anew (a new button has none of them); so is Send's state
  new MutationObserver(() => { markChatsToggle(); window.minisglSyncSend(); window.minisglSyncStop(); }).observe(document.body, {childList: true, subtree: true});
  markChatsToggle();
  window.minisglSyncSend();
}

// The models panel's messages (a pull's line, a switch's) sit low in the sidebar, under its fold
// on a laptop's screen: a message that changes is scrolled into view inside the sidebar, so a
// pull that failed says so where the user looks (nearest: the page itself does not jump).
function bringPanelMessagesIntoView() {
  const shown = new Map();
  const check = () => {
    for (const id of ['pull-message', 'model-message']) {
      const box = document.getElementById(id);
      const text = box?.innerText.trim() ?? '';
      if (!box || text === (shown.get(id) ?? '')) continue;
      shown.set(id, text);
      if (text && box.getClientRects().length) box.scrollIntoView({block: 'nearest', behavior: 'instant'});
    }
  };
  new MutationObserver(check).observe(document.body, {subtree: true, childList: true, characterData: true});
}
