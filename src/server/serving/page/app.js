// tern's chat page: chats kept in localStorage, answers streamed from /v1/chat/completions (SSE), Stop aborts the
// fetch (the server cancels a generation whose client went away), thinking shown apart and collapsible, errors
// shown as errors, tok/s and time to first token per answer; until the first token, where the request stands (the
// server's prompt_progress: waiting in its queue, or reading the prompt). Messages can be copied, deleted, edited
// and resent; the last answer regenerated. New chat, switching and deleting chats stop a streaming answer first
// (deleting asks).
// Images (the pick button, a paste or a drop) wait as thumbnails in the composer and go with the question as OpenAI
// image_url parts (data: URLs); the chat keeps them (their bytes in IndexedDB) and resends them with each question.
// Code blocks are highlighted (highlight.js) and formulas rendered (KaTeX), both served by this server under /page/.
// No network but this server's own API.
'use strict';
(() => {
  const $ = id => document.getElementById(id);
  const log = $('log'), input = $('input'), sendBtn = $('send'), stopBtn = $('stop');
  const STORE_CHATS = 'tern.chats', STORE_CURRENT = 'tern.current', STORE_SETTINGS = 'tern.settings';
  // Enter in a message box: on a touch device (its primary pointer coarse: a phone or tablet, whose on-screen
  // keyboard has no Shift+Enter) Enter adds a line and the Send button sends, as ChatGPT's and Open WebUI's pages do
  // on phones; elsewhere (a keyboard) Enter sends and Shift+Enter adds a line. Asked at each key, so it follows a change.
  const touchQuery = matchMedia('(pointer: coarse)'), narrowQuery = matchMedia('(max-width: 760px)');
  const enterSends = () => !touchQuery.matches;
  const hintText = () => enterSends() ? 'Ask anything. Enter sends, Shift+Enter adds a line, Esc stops.'
                                      : 'Ask anything. Enter adds a line, the Send button sends.';
  const DEFAULTS = {system: '', temperature: '', top_p: '', max_tokens: 2048, thinking: true, thinking_budget: ''};

  // ---- storage ------------------------------------------------------------------------------------------
  const load = (key, fallback) => {
    try { const v = JSON.parse(localStorage.getItem(key)); return v === null ? fallback : v; } catch { return fallback; }
  };
  const store = (key, value) => {
    try { localStorage.setItem(key, JSON.stringify(value)); } catch (e) { console.warn('tern: not saved:', e); }
  };
  let settings = Object.assign({}, DEFAULTS, load(STORE_SETTINGS, {}));
  let chats = load(STORE_CHATS, []);
  if (!Array.isArray(chats)) chats = [];
  let current = chats.find(c => c.id === load(STORE_CURRENT, null)) || null;
  let sweepTimer = 0;
  const saveChats = () => {
    store(STORE_CHATS, chats);
    store(STORE_CURRENT, current ? current.id : null);
    clearTimeout(sweepTimer);  // the images of deleted messages and chats go a little later, once
    sweepTimer = setTimeout(sweepImages, 1000);
  };

  // ---- images: their bytes in IndexedDB, a message keeps their ids ----------------------------------------------
  // localStorage holds a few megabytes in all, less than one photo as a data: URL; IndexedDB holds far more. A
  // question's images are [{id, name}]; each one's data: URL is stored under its id, and kept in memory once read.
  // Without IndexedDB (some private modes) they last as long as the tab.
  const IMAGE_DB = 'tern', IMAGE_STORE = 'images';
  const imageUrls = new Map();  // id -> data: URL
  let imageDb = null;
  function openImageDb() {
    if (!imageDb) imageDb = new Promise((resolve, reject) => {
      const r = indexedDB.open(IMAGE_DB, 1);
      r.onupgradeneeded = () => r.result.createObjectStore(IMAGE_STORE);
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error);
    });
    return imageDb;
  }
  // One request in a transaction of its own: its result once the transaction is done.
  async function imageRequest(mode, make) {
    const db = await openImageDb();
    return new Promise((resolve, reject) => {
      const tx = db.transaction(IMAGE_STORE, mode), r = make(tx.objectStore(IMAGE_STORE));
      tx.oncomplete = () => resolve(r.result);
      tx.onerror = tx.onabort = () => reject(tx.error || r.error);
    });
  }
  function keepImage(id, url) {
    imageUrls.set(id, url);
    imageRequest('readwrite', s => s.put(url, id)).catch(e => {
      console.warn('tern: image not saved:', e);
      showNote('An image could not be saved in this browser (' + (e && e.message) + '): it goes with this tab.');
    });
  }
  // A stored image's data: URL; null once it is gone (storage cleared, or never kept).
  async function imageUrl(id) {
    if (!imageUrls.has(id)) {
      try {
        const url = await imageRequest('readonly', s => s.get(id));
        if (url) imageUrls.set(id, url);
      } catch (e) { console.warn('tern: image not read:', e); }
    }
    return imageUrls.get(id) || null;
  }
  // Drops the stored images that no chat refers to. The listing and the deletes share one transaction, and what is
  // referred to is read when the listing is in, so an image stored meanwhile (its question already in a chat) stays.
  // Another tab's chats count too, through what it saved.
  function sweepImages() {
    openImageDb().then(db => {
      const tx = db.transaction(IMAGE_STORE, 'readwrite'), st = tx.objectStore(IMAGE_STORE), keys = st.getAllKeys();
      keys.onsuccess = () => {
        const saved = load(STORE_CHATS, []), used = new Set();
        for (const c of chats.concat(Array.isArray(saved) ? saved : []))
          for (const m of c.messages || []) for (const im of m.images || []) used.add(im.id);
        for (const k of keys.result) if (!used.has(k)) { st.delete(k); imageUrls.delete(k); }
      };
    }).catch(e => console.warn('tern: images not swept:', e));
  }

  // ---- model info: GET /props (model, random_weights, n_ctx), else GET /v1/models for the name ----------------
  const info = {model: null, random_weights: null, n_ctx: null};
  async function loadModelInfo() {
    try {
      const r = await fetch('/props', {headers: authHeaders()});
      if (r.ok) Object.assign(info, await r.json());
    } catch { /* older server: no /props */ }
    if (!info.model) {
      try {
        const r = await fetch('/v1/models', {headers: authHeaders()});
        if (r.ok) { const d = (await r.json()).data; if (d && d.length) info.model = d[0].id; }
        else if (r.status === 401) info.model = '(API key needed: see settings)';
      } catch { /* shown below */ }
    }
    // Without /props, the demo model still says what it is through its id.
    if (info.random_weights == null && info.model && /random-weights/.test(info.model)) info.random_weights = true;
    $('model-name').textContent = info.model || 'model unknown (server unreachable?)';
    $('model-ctx').textContent = info.n_ctx ? 'context ' + info.n_ctx.toLocaleString('en-US') + ' tokens' : '';
    const warn = $('warning');
    warn.hidden = info.random_weights !== true;
    warn.textContent = 'Random weights (the demo model): its answers are noise. Serve real weights with tern serve -m DIR.';
  }

  // ---- rendering --------------------------------------------------------------------------------------------
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  // Autoscroll follows new text unless the user scrolled up; scrolling back to the bottom turns it on again.
  let stick = true;
  log.addEventListener('scroll', () => { stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 30; });
  const follow = () => { if (stick) log.scrollTop = log.scrollHeight; };

  // A prompt_progress object (the server's, sent with return_progress) as the line shown before the first token:
  // "waiting for 2 requests ahead" while queued, "reading prompt 12,000 / 31,000" while the prompt is read; ""
  // once it is read (the first token is near: the usual "…").
  function progressText(p) {
    const n = v => Number(v || 0).toLocaleString('en-US');
    if (p.queued) {
      const ahead = Number(p.queued_ahead || 0);
      return ahead > 0 ? 'waiting for ' + n(ahead) + (ahead === 1 ? ' request' : ' requests') + ' ahead'
                       : 'waiting for a running request to finish';
    }
    if (!(p.total > 0) || p.processed >= p.total) return '';
    const reused = p.cache > 0 ? ' (' + n(p.cache) + ' reused)' : '';
    return 'reading prompt ' + n(p.processed) + ' / ' + n(p.total) + reused;
  }

  function statsText(m) {
    const s = m.stats || {}, parts = [];
    if (s.tok_s != null) parts.push(s.tok_s.toFixed(1) + ' tok/s');
    if (s.ttft_s != null) parts.push('first token ' + s.ttft_s.toFixed(2) + ' s');
    if (s.completion_tokens != null) parts.push(s.completion_tokens + ' tokens');
    if (s.prompt_tokens != null) parts.push('prompt ' + s.prompt_tokens + (s.cached_tokens ? ' (' + s.cached_tokens + ' cached)' : ''));
    if (s.finish) parts.push(s.finish);
    return parts.join(' · ');
  }

  const actionButton = (act, label, title) => {
    const b = el('button', 'act', label);
    b.type = 'button';
    b.dataset.act = act;
    b.title = title;
    b.setAttribute('aria-label', title);
    return b;
  };
  // Each message's buttons (handled by one listener on the log, below). Regenerate shows on the last message only.
  function actionsView(m) {
    const bar = el('div', 'actions');
    if (m.role === 'user') {
      bar.append(actionButton('edit', 'Edit', 'Edit this message and send it again (drops what followed it)'),
                 actionButton('delete', 'Delete', 'Delete this message and the answers to it'));
    } else if (m.role === 'assistant') {
      bar.append(actionButton('copy', 'Copy', 'Copy this answer'),
                 actionButton('regenerate', 'Regenerate', 'Drop this answer and ask again'),
                 actionButton('delete', 'Delete', 'Delete this answer'));
    } else {
      if (m.kind === 'context')
        bar.append(actionButton('continue', 'New chat from the last messages',
                                'Start a new chat with the last messages of this one, and ask again there'));
      bar.append(actionButton('regenerate', 'Retry', 'Ask again'), actionButton('delete', 'Delete', 'Delete this error'));
    }
    return bar;
  }

  // A question's images as thumbnails (a click shows one whole); read from storage, so they may fill in a moment later.
  function imagesView(images) {
    const row = el('div', 'images');
    for (const im of images) {
      const img = el('img', 'thumb');
      img.alt = img.title = im.name || 'image';
      const known = imageUrls.get(im.id);
      if (known) img.src = known;
      else imageUrl(im.id).then(url => {
        if (url) img.src = url;
        else img.replaceWith(el('span', 'thumb missing', 'image not kept in this browser'));
      });
      row.append(img);
    }
    return row;
  }

  // One message's element (its message in box.msg); assistant messages keep handles to update while streaming.
  function messageView(m) {
    if (m.role === 'user' || m.role === 'error') {
      const box = el('div', 'msg ' + m.role);
      if (m.images && m.images.length) box.append(imagesView(m.images));
      box.append(el('div', 'text', m.content), actionsView(m));
      box.msg = m;
      return box;
    }
    const box = el('div', 'msg assistant');
    box.msg = m;
    const think = el('details', 'thinking'), summary = el('summary'), body = el('div', 'body');
    think.append(summary, body);
    const content = el('div', 'content'), meta = el('div', 'meta'), progress = el('div', 'progress');
    box.append(think, progress, content, meta, actionsView(m));
    // progressText: where the request stands until its first token (set while streaming; never saved).
    const view = {box, think, summary, body, content, meta, progress, progressText: '', userToggled: false};
    // The user's choice counts from the click itself ('toggle' events arrive later, after a render may have run).
    summary.addEventListener('click', () => { view.userToggled = true; });
    view.update = (streaming) => {
      box.classList.toggle('streaming', streaming);
      // In place of the bare "…" until anything of the answer arrives.
      const status = streaming && !m.content && !m.reasoning ? view.progressText : '';
      progress.textContent = status;
      progress.hidden = !status;
      box.classList.toggle('waiting', !!status);
      think.hidden = !m.reasoning;
      if (m.reasoning) {
        body.textContent = m.reasoning;
        const thinkingNow = streaming && !m.content;
        summary.textContent = (thinkingNow ? 'Thinking… ' : 'Thought · ') + (m.reasoning_tokens || 0) + ' tokens';
        // Open while it thinks, folded once the answer starts, unless the user chose.
        if (!view.userToggled && think.open !== thinkingNow) think.open = thinkingNow;
      }
      content.innerHTML = ternMarkdown.render(m.content || '');
      decorate(content);
      meta.textContent = statsText(m);
    };
    view.update(false);
    box.view = view;
    return box;
  }

  // ---- code highlighting (highlight.js) and math (KaTeX), served by this server under /page/ -------------------
  // Answers are re-rendered on every streamed update, so results are cached by their source; a code block whose
  // fence is still open (data-open) is left plain until it closes. Both are skipped if a library did not load.
  if (window.hljs) hljs.configure({hideUpgradeWarningAcceptNoSupportOrSecurityUpdates: true});  // Debian's, patched
  const decorated = new Map();
  const cached = (key, make) => {
    let v = decorated.get(key);
    if (v === undefined) {
      v = make();
      if (decorated.size >= 500) decorated.delete(decorated.keys().next().value);
      decorated.set(key, v);
    }
    return v;
  };
  function decorate(root) {
    if (window.hljs) for (const code of root.querySelectorAll('pre:not([data-open]) > code')) {
      const m = /\blanguage-([\w+#.-]+)/.exec(code.className), text = code.textContent;
      const lang = m && hljs.getLanguage(m[1]) ? m[1] : '';  // named and known, else detected
      if (m && /^(text|plain|plaintext|txt)$/i.test(m[1])) continue;
      try {
        code.innerHTML = cached('c' + lang + '\u0000' + text,
          () => (lang ? hljs.highlight(lang, text, true) : hljs.highlightAuto(text)).value);
        code.classList.add('hljs');
      } catch (e) { console.warn('tern: highlighting failed:', e); }
    }
    if (window.katex) for (const span of root.querySelectorAll('span.math')) {
      const display = span.classList.contains('display'), tex = span.textContent;
      span.innerHTML = cached('m' + (display ? 'd' : 'i') + '\u0000' + tex, () => {
        try { return katex.renderToString(tex, {displayMode: display, throwOnError: false}); }
        catch { return ternMarkdown.escapeHtml(tex); }  // KaTeX's own limits (e.g. too many expansions)
      });
    }
  }

  function renderChat() {
    log.replaceChildren();
    const msgs = current ? current.messages : [];
    if (!msgs.length) {
      const hint = el('div', 'muted', hintText());
      hint.id = 'empty';
      log.append(hint);
    }
    for (const m of msgs) log.append(messageView(m));
    refreshActions();
    stick = true;
    follow();
    renderChatList();
  }

  // While an answer streams, only Copy works; Regenerate/Retry only on the last message.
  function refreshActions() {
    const boxes = [...log.querySelectorAll('.msg')];
    for (const b of log.querySelectorAll('.actions button')) {
      if (b.dataset.act !== 'copy') b.disabled = streaming !== null;
      if (b.dataset.act === 'regenerate') b.hidden = b.closest('.msg') !== boxes[boxes.length - 1];
    }
  }

  function renderChatList() {
    const ul = $('chat-list');
    ul.replaceChildren();
    for (const c of [...chats].sort((a, b) => b.updated - a.updated)) {
      const li = el('li', c === current ? 'current' : '');
      const title = el('span', 'title', c.title || 'New chat');
      title.title = c.title || '';
      title.tabIndex = 0;
      title.setAttribute('role', 'button');
      title.onclick = async () => {
        await stopAndWait();  // a streaming answer stops (and is kept) before the switch
        current = c;
        saveChats();
        renderChat();
        closeDrawer();
      };
      title.onkeydown = e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); title.click(); } };
      const del = el('button', 'del', '\u00d7');
      del.type = 'button';
      del.title = 'Delete this chat';
      del.setAttribute('aria-label', 'Delete this chat');
      // Deleting asks first, in place: "Delete? Yes / No".
      del.onclick = () => {
        const q = el('span', 'title confirm', 'Delete \u201c' + (c.title || 'New chat') + '\u201d?');
        const yes = el('button', 'yes', 'Yes'), no = el('button', 'no', 'No');
        yes.type = no.type = 'button';
        yes.title = 'Delete this chat for good';
        no.title = 'Keep this chat';
        yes.onclick = async () => {
          if (c === current) await stopAndWait();
          chats = chats.filter(x => x !== c);
          if (current === c) current = null;
          saveChats();
          renderChat();
        };
        no.onclick = () => renderChatList();
        li.classList.add('confirming');
        li.replaceChildren(q, yes, no);
        no.focus();
      };
      li.append(title, del);
      ul.append(li);
    }
  }

  async function copyText(text, btn) {
    testHooks.copied = text;  // what was copied, for tests (headless Chromium may have no clipboard)
    let ok = false;
    try { await navigator.clipboard.writeText(text); ok = true; } catch {
      const t = el('textarea');  // plain-http pages on another host have no clipboard API
      t.value = text;
      document.body.append(t);
      t.select();
      try { ok = document.execCommand('copy'); } catch { ok = false; }
      t.remove();
    }
    btn.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  }

  // Copy buttons of code blocks (event delegation: blocks are re-rendered while streaming).
  log.addEventListener('click', e => {
    const btn = e.target.closest('button.copy');
    if (btn) copyText(btn.closest('.code').querySelector('code').textContent, btn);
  });

  // ---- repairing a conversation: message actions --------------------------------------------------------------
  const withScroll = fn => { const top = log.scrollTop; fn(); log.scrollTop = top; };

  // Deleting a question deletes the answers (and errors) after it up to the next question; an answer goes alone.
  function deleteMessage(m) {
    const msgs = current.messages, i = msgs.indexOf(m);
    if (i < 0) return;
    let j = i + 1;
    if (m.role === 'user') while (j < msgs.length && msgs[j].role !== 'user') j++;
    msgs.splice(i, j - i);
    current.updated = Date.now();
    saveChats();
    withScroll(renderChat);
  }

  // Drops what follows the last question and asks it again.
  function regenerate() {
    const msgs = current.messages;
    let i = msgs.length;
    while (i > 0 && msgs[i - 1].role !== 'user') i--;
    if (i === 0) return;
    msgs.splice(i);
    renderChat();
    ask();
  }

  // Edits a question in place; Send (or Enter) drops what followed it and asks again, Cancel (or Esc) keeps it.
  // Its images stay as they are.
  function editMessage(box, m) {
    if (box.querySelector('.edit')) return;
    const ta = el('textarea', 'edit');
    ta.value = m.content;
    ta.rows = Math.min(12, m.content.split('\n').length + 1);
    ta.setAttribute('aria-label', 'Edit the message');
    const bar = el('div', 'actions');
    bar.append(actionButton('resend', 'Send', 'Send the edited message (drops what followed it)'),
               actionButton('cancel', 'Cancel', 'Keep the message as it was'));
    box.classList.add('editing');
    box.replaceChildren(ta, bar);
    if (m.images && m.images.length) box.prepend(imagesView(m.images));
    ta.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && enterSends()) {
        e.preventDefault();
        bar.firstChild.click();
      } else if (e.key === 'Escape') { e.stopPropagation(); bar.lastChild.click(); }
    });
    ta.focus();
  }

  function resend(box, m) {
    const text = box.querySelector('textarea.edit').value;
    if ((!text.trim() && !(m.images || []).length) || streaming) return;
    const msgs = current.messages, i = msgs.indexOf(m);
    if (i < 0) return;
    m.content = text;
    msgs.splice(i + 1);
    if (i === 0) current.title = text.trim().split('\n')[0].slice(0, 60);
    renderChat();
    ask();
  }

  // After a context-overflow error: a new chat with the chat's last messages (about half the context's worth, at
  // least the last question), asked again there. The old chat stays as it was.
  function continueInNewChat(err) {
    const old = current, msgs = old.messages.filter(x => x.role !== 'error');
    let last = msgs.length - 1;
    while (last >= 0 && msgs[last].role !== 'user') last--;
    if (last < 0) return;
    const chars = msgs.slice(0, last + 1).reduce((n, x) => n + x.content.length, 0);
    const budget = err.prompt_tokens && err.n_ctx ? chars * (err.n_ctx / 2) / err.prompt_tokens : chars / 2;
    let start = last, used = msgs[last].content.length;
    while (start > 0 && used + msgs[start - 1].content.length <= budget) used += msgs[--start].content.length;
    while (msgs[start].role !== 'user') start++;  // the new chat begins with a question
    current = {id: newId(), title: (old.title || 'Chat') + ' (continued)',
      messages: msgs.slice(start, last + 1).map(x => JSON.parse(JSON.stringify(x))), updated: Date.now()};
    chats.push(current);
    saveChats();
    renderChat();
    ask();
  }

  log.addEventListener('click', e => {
    const btn = e.target.closest('button[data-act]');
    if (!btn || btn.disabled || !current) return;
    const box = btn.closest('.msg'), m = box && box.msg;
    if (!m) return;
    const act = btn.dataset.act;
    if (act === 'copy') copyText(m.content, btn);
    if (streaming) return;
    if (act === 'delete') deleteMessage(m);
    else if (act === 'regenerate') regenerate();
    else if (act === 'edit') editMessage(box, m);
    else if (act === 'resend') resend(box, m);
    else if (act === 'cancel') { box.replaceWith(messageView(m)); refreshActions(); }
    else if (act === 'continue') continueInNewChat(m);
  });

  // ---- sending --------------------------------------------------------------------------------------------
  let streaming = null;  // {controller} while an answer streams
  // Tests merge fields into the request body (e.g. a forced output) and read the last one sent.
  const testHooks = {extraBody: null, lastBody: null};

  function authHeaders() {
    const h = {};
    const key = sessionStorage.getItem('tern.key');
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  function setStreaming(on) {
    sendBtn.disabled = on;
    stopBtn.disabled = !on;
    refreshActions();
  }

  // A question with images is a list of parts, the images first (as Qwen's own examples put them), each a data: URL.
  // An image no longer stored is left out (its thumbnail says so).
  async function userContent(m) {
    if (!m.images || !m.images.length) return m.content;
    const parts = [];
    for (const im of m.images) {
      const url = await imageUrl(im.id);
      if (url) parts.push({type: 'image_url', image_url: {url}});
    }
    if (m.content) parts.push({type: 'text', text: m.content});
    return parts;
  }

  // The chat as it stands when called (taken at once; the images are read from storage after).
  async function apiMessages() {
    const out = [], msgs = current.messages.slice();
    if (settings.system.trim()) out.push({role: 'system', content: settings.system});
    for (const m of msgs) {
      if (m.role === 'user') out.push({role: 'user', content: await userContent(m)});
      else if (m.role === 'assistant' && m.content) out.push({role: 'assistant', content: m.content});
    }
    return out;
  }

  async function requestBody() {
    const b = {messages: null, stream: true, stream_options: {include_usage: true}, return_progress: true,
      max_tokens: Math.max(1, parseInt(settings.max_tokens, 10) || DEFAULTS.max_tokens),
      chat_template_kwargs: {enable_thinking: !!settings.thinking}};
    if (settings.temperature !== '' && settings.temperature != null) b.temperature = Number(settings.temperature);
    if (settings.top_p !== '' && settings.top_p != null) b.top_p = Number(settings.top_p);
    if (settings.thinking && settings.thinking_budget !== '' && settings.thinking_budget != null)
      b.thinking_budget = Number(settings.thinking_budget);
    Object.assign(b, testHooks.extraBody || {});
    b.messages = await apiMessages();
    testHooks.lastBody = b;  // what was last sent, for tests
    return b;
  }

  async function errorOf(res) {
    const text = await res.text();
    try {
      const j = JSON.parse(text);
      if (j.error && j.error.message) return {message: j.error.message, code: j.error.code, param: j.error.param};
    } catch { /* not JSON */ }
    return {message: text.trim() || res.statusText, code: null, param: null};
  }

  // Whether a 400 is about one of the request's images: its param names a part of the body that is an image.
  function refusedImage(body, err) {
    const r = /^messages\[(\d+)\]\.content\[(\d+)\]/.exec(err.param || '');
    const m = r && body.messages[Number(r[1])], part = m && Array.isArray(m.content) && m.content[Number(r[2])];
    return !!part && part.type === 'image_url';
  }
  const hasImages = body => body.messages.some(m => Array.isArray(m.content));
  // Every question resends the chat's images, so one the server refuses stops the chat until it goes.
  const IMAGE_HINT = ' Every question resends this chat\'s images: delete the question with the image to go on here, ' +
    'or start a new chat.';

  function addError(chat, m) {
    if (typeof m === 'string') m = {role: 'error', content: m};
    chat.messages.push(m);
    if (chat !== current) return;
    log.append(messageView(m));
    refreshActions();
    follow();
  }

  // The server's 400 for a prompt longer than the context talks about --ctx-size; the page says what its user can do.
  function contextError(message) {
    const num = re => { const r = re.exec(message); return r ? Number(r[1]) : null; };
    const prompt = num(/prompt has (\d+) tokens/), ctx = num(/context is (\d+) tokens/) || info.n_ctx;
    return {role: 'error', kind: 'context', prompt_tokens: prompt, n_ctx: ctx,
      content: 'This chat is too long for the model\'s context' +
        (prompt && ctx ? ' (' + prompt.toLocaleString('en-US') + ' tokens; the model takes ' +
          ctx.toLocaleString('en-US') + ')' : '') +
        '. Start a new chat from the last messages, or delete messages above and retry.'};
  }

  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 7);

  // Sends a question; `images` ({id, name, url} from the composer) are stored and go with it.
  async function send(text, images = []) {
    if (streaming || (!text.trim() && !images.length)) return;
    if (!current) {
      current = {id: newId(), title: '', messages: [], updated: Date.now()};
      chats.push(current);
    }
    if (!current.title) current.title = text.trim().split('\n')[0].slice(0, 60) || (images[0] && images[0].name);
    if (!current.messages.length) log.replaceChildren();
    const user = {role: 'user', content: text};
    if (images.length) user.images = images.map(a => ({id: a.id, name: a.name}));
    current.messages.push(user);
    for (const a of images) keepImage(a.id, a.url);  // after the push: a sweep meanwhile sees the question
    log.append(messageView(user));
    return ask();
  }

  // Streams an answer to the current chat as it stands (its last message is a question).
  async function ask() {
    if (streaming || !current) return;
    const bodyReady = requestBody();  // the chat before the answer joins it; its images are read meanwhile
    const m = {role: 'assistant', content: '', reasoning: '', reasoning_tokens: 0, stats: {}};
    current.messages.push(m);
    const box = messageView(m);
    log.append(box);
    current.updated = Date.now();
    saveChats();
    renderChatList();
    stick = true;
    follow();

    const controller = new AbortController();
    let finished;
    streaming = {controller, done: new Promise(resolve => { finished = resolve; })};
    setStreaming(true);
    const chat = current;
    const t0 = performance.now();
    let tFirst = null, tLast = null, deltas = 0, finish = null, usage = null, failed = false, drawn = false, lastSave = 0;
    const redraw = () => {
      if (drawn) return;
      drawn = true;
      requestAnimationFrame(() => {
        drawn = false;
        box.view.update(streaming !== null);
        follow();
        if (performance.now() - lastSave > 1000) { lastSave = performance.now(); saveChats(); }
      });
    };
    const onEvent = data => {
      const j = JSON.parse(data);
      if (j.error) {
        failed = true;
        addError(chat, (j.error.message || 'The server reported an error.') + (j.error.type ? ' (' + j.error.type + ')' : ''));
        return;
      }
      if (j.usage) usage = j.usage;
      if (j.prompt_progress) box.view.progressText = progressText(j.prompt_progress);
      for (const ch of j.choices || []) {
        const d = ch.delta || {};
        if (d.reasoning_content || d.content || d.tool_calls) {
          const now = performance.now();
          if (tFirst === null) tFirst = now;
          tLast = now;
          deltas++;
        }
        if (d.reasoning_content) { m.reasoning += d.reasoning_content; m.reasoning_tokens++; }
        if (d.content) m.content += d.content;
        if (d.tool_calls) m.content += '\n```json\n' + JSON.stringify(d.tool_calls) + '\n```\n';
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      redraw();
    };
    let body = null;
    try {
      body = await bodyReady;
      const res = await fetch('/v1/chat/completions', {method: 'POST', signal: controller.signal,
        headers: Object.assign({'Content-Type': 'application/json'}, authHeaders()), body: JSON.stringify(body)});
      if (!res.ok) {
        failed = true;
        const err = await errorOf(res);
        if (res.status === 400 && err.code === 'context_length_exceeded') addError(chat, contextError(err.message));
        else if (res.status === 400 && refusedImage(body, err))
          addError(chat, 'The server refused an image (HTTP 400): ' + err.message + IMAGE_HINT);
        else if (res.status === 413 && hasImages(body)) addError(chat, 'HTTP 413: ' + err.message + IMAGE_HINT);
        else addError(chat, 'HTTP ' + res.status + ': ' + err.message);
      } else {
        const reader = res.body.getReader(), dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buf += dec.decode(value, {stream: true});
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            for (const line of block.split('\n')) {
              if (!line.startsWith('data:')) continue;  // SSE comments (keep-alives)
              const data = line.slice(5).trim();
              if (data && data !== '[DONE]') onEvent(data);
            }
          }
        }
      }
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else { failed = true; addError(chat, 'Connection failed: ' + e.message); }
    }
    streaming = null;
    setStreaming(false);
    const tokens = usage ? usage.completion_tokens : deltas;
    m.stats = {
      ttft_s: tFirst !== null ? (tFirst - t0) / 1000 : null,
      // Tokens after the first over the time after the first: the decode rate, apart from the prompt's time.
      tok_s: tFirst !== null && tLast > tFirst && tokens > 1 ? (tokens - 1) / ((tLast - tFirst) / 1000) : null,
      completion_tokens: tokens || null,
      prompt_tokens: usage ? usage.prompt_tokens : null,
      cached_tokens: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : null,
      finish: finish === 'stopped' ? 'stopped' : finish === 'length' ? 'max tokens reached' : null,
    };
    if (failed && !m.content && !m.reasoning) {  // nothing came: the error alone stands for the answer
      chat.messages.splice(chat.messages.indexOf(m), 1);
      box.remove();
    } else {
      box.view.update(false);
    }
    chat.updated = Date.now();
    saveChats();
    follow();
    refreshActions();
    if (chat === current) input.focus();
    finished();
  }

  function stop() { if (streaming) streaming.controller.abort(); }
  // Stops a streaming answer (keeping what came) and waits until it is put away.
  async function stopAndWait() {
    if (!streaming) return;
    const done = streaming.done;
    streaming.controller.abort();
    await done;
  }

  // ---- composer ----------------------------------------------------------------------------------------------
  const grow = () => { input.style.height = 'auto'; input.style.height = input.scrollHeight + 2 + 'px'; };
  input.addEventListener('input', grow);
  input.addEventListener('keydown', e => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && enterSends()) {
      e.preventDefault();
      $('composer').requestSubmit();
    } else if (e.key === 'Escape') {
      stop();
    }
  });
  $('composer').addEventListener('submit', e => {
    e.preventDefault();
    if (streaming) return;
    const text = input.value, images = attached;
    if (!text.trim() && !images.length) return;
    input.value = '';
    grow();
    attached = [];
    renderAttached();
    showNote('');
    send(text, images);
  });
  stopBtn.addEventListener('click', stop);
  // The placeholder names Shift+Enter only where it applies and there is room for it (a narrow box would clip it).
  function fitComposer() {
    input.placeholder = enterSends() && !narrowQuery.matches ? 'Message (Shift+Enter: new line)' : 'Message';
    const hint = $('empty');
    if (hint) hint.textContent = hintText();
  }
  touchQuery.addEventListener('change', fitComposer);
  narrowQuery.addEventListener('change', fitComposer);
  fitComposer();
  document.addEventListener('keydown', e => { if (e.key === 'Escape' && streaming && !viewer.open) stop(); });

  // ---- attaching images: the pick button, a paste, a drop; thumbnails in the composer until sent -------------------
  const MAX_IMAGE_BYTES = 20 << 20;  // a phone's photo is a few MB; past this it is hardly a picture meant for a chat
  // The formats the server reads, told by their first bytes: a file's type comes from its name, and may be wrong.
  const IMAGE_MAGIC = [['image/png', '\x89PNG'], ['image/jpeg', '\xff\xd8\xff'], ['image/gif', 'GIF8']];
  function sniffImage(head) {
    const text = String.fromCharCode(...head);
    for (const [type, magic] of IMAGE_MAGIC) if (text.startsWith(magic)) return type;
    return text.startsWith('RIFF') && text.slice(8, 12) === 'WEBP' ? 'image/webp' : null;
  }
  let attached = [];  // [{id, name, url}]: the composer's images, sent with the next question
  const note = $('attach-note');
  function showNote(text) {
    note.textContent = text;
    note.hidden = !text;
  }
  const megabytes = n => (n / (1 << 20)).toFixed(1).replace(/\.0$/, '') + ' MB';
  const readDataUrl = file => new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
  // A file as an attachment {id, name, url}, or why it is refused (a sentence).
  async function readImage(file) {
    const name = file.name || 'The pasted image';
    const type = sniffImage(new Uint8Array(await file.slice(0, 12).arrayBuffer()));
    if (!type) {
      return file.type.startsWith('image/')
        ? name + ' (' + file.type + ') is in a format the server does not read: send a PNG, JPEG, WebP or GIF.'
        : name + ' is not an image (PNG, JPEG, WebP or GIF).';
    }
    if (file.size > MAX_IMAGE_BYTES)
      return name + ' is ' + megabytes(file.size) + ': images up to ' + megabytes(MAX_IMAGE_BYTES) + ' are sent.';
    const url = await readDataUrl(file);
    // The sniffed type, not the file's (empty for some, and the server checks it).
    return {id: newId(), name, url: 'data:' + type + ';base64,' + url.slice(url.indexOf(',') + 1)};
  }
  async function attachFiles(files) {
    const refused = [];
    for (const file of files) {
      try {
        const r = await readImage(file);
        if (typeof r === 'string') refused.push(r);
        else attached.push(r);
      } catch (e) { refused.push((file.name || 'The file') + ' could not be read: ' + e.message); }
    }
    showNote(refused.join(' '));
    renderAttached();
    input.focus();
  }
  function renderAttached() {
    const box = $('attachments');
    box.replaceChildren(...attached.map(a => {
      const item = el('span', 'attachment'), img = el('img', 'thumb'), x = el('button', 'remove', '\u00d7');
      img.src = a.url;
      img.alt = img.title = a.name;
      x.type = 'button';
      x.title = 'Remove ' + a.name;
      x.setAttribute('aria-label', x.title);
      x.onclick = () => {
        attached = attached.filter(o => o !== a);
        renderAttached();
        input.focus();
      };
      item.append(img, x);
      return item;
    }));
    box.hidden = !attached.length;
  }
  $('attach').onclick = () => $('file').click();
  $('file').addEventListener('change', e => {
    attachFiles([...e.target.files]);
    e.target.value = '';  // the same file can be picked again
  });
  // A pasted image is attached; pasted text goes into the box as ever (a spreadsheet's cells come as both: text
  // wins). Not in another box (editing a question, settings): the image would land far from where it was pasted.
  document.addEventListener('paste', e => {
    const files = e.clipboardData ? [...e.clipboardData.files] : [];
    if (!files.length || e.clipboardData.types.includes('text/plain')) return;
    if (e.target !== input && e.target.closest && e.target.closest('textarea, input, dialog')) return;
    e.preventDefault();
    attachFiles(files);
  });
  // Files dropped anywhere on the page are attached (and never open in its place); the chat shows where while one
  // is dragged over. dragenter and dragleave come for every element crossed, hence the count.
  const dragsFiles = e => !!e.dataTransfer && [...e.dataTransfer.types].includes('Files');
  let dragDepth = 0;
  const dropping = on => { $('main').classList.toggle('dropping', on); };
  document.addEventListener('dragenter', e => { if (dragsFiles(e)) dropping(++dragDepth > 0); });
  document.addEventListener('dragleave', e => { if (dragsFiles(e)) dropping(--dragDepth > 0); });
  document.addEventListener('dragover', e => {
    if (!dragsFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = 'copy';
  });
  document.addEventListener('drop', e => {
    dragDepth = 0;
    dropping(false);
    if (!dragsFiles(e)) return;
    e.preventDefault();
    attachFiles([...e.dataTransfer.files]);
  });
  // A thumbnail's click shows the image whole; a click or Esc closes it.
  const viewer = $('viewer');
  function showImage(img) {
    if (!img.src) return;
    const big = el('img');
    big.src = img.src;
    big.alt = img.alt;
    viewer.replaceChildren(big);
    viewer.showModal();
  }
  viewer.addEventListener('click', () => viewer.close());
  for (const root of [log, $('attachments')]) root.addEventListener('click', e => {
    const img = e.target.closest('img.thumb');
    if (img) showImage(img);
  });

  // ---- chats, drawer, settings ---------------------------------------------------------------------------------
  const closeDrawer = () => { $('sidebar').classList.remove('open'); $('scrim').hidden = true; };
  $('menu').onclick = () => { $('sidebar').classList.add('open'); $('scrim').hidden = false; };
  $('scrim').onclick = closeDrawer;
  $('new-chat').onclick = async () => {
    await stopAndWait();  // a streaming answer stops (and is kept in its chat) first
    current = null;
    saveChats();
    renderChat();
    closeDrawer();
    input.focus();
  };

  const dialog = $('settings');
  const fields = {system: 's-system', temperature: 's-temperature', top_p: 's-top-p', max_tokens: 's-max-tokens',
    thinking_budget: 's-thinking-budget'};
  function showSettings() {
    for (const [k, id] of Object.entries(fields)) $(id).value = settings[k];
    $('s-thinking').checked = !!settings.thinking;
    $('s-key').value = sessionStorage.getItem('tern.key') || '';
    $('settings-error').hidden = true;
    dialog.showModal();
  }
  function readSettings() {
    const next = {system: $('s-system').value, temperature: $('s-temperature').value.trim(), top_p: $('s-top-p').value.trim(),
      max_tokens: $('s-max-tokens').value.trim(), thinking: $('s-thinking').checked,
      thinking_budget: $('s-thinking-budget').value.trim()};
    const problems = [];
    const t = Number(next.temperature), p = Number(next.top_p), n = Number(next.max_tokens);
    if (next.temperature !== '' && !(t >= 0 && t <= 2)) problems.push('temperature must be between 0 and 2');
    if (next.top_p !== '' && !(p > 0 && p <= 1)) problems.push('top-p must be above 0 and at most 1');
    if (!(Number.isInteger(n) && n >= 1)) problems.push('max tokens must be a whole number of at least 1');
    const tb = Number(next.thinking_budget);
    if (next.thinking_budget !== '' && !(Number.isInteger(tb) && tb >= 0))
      problems.push('thinking budget must be a whole number of at least 0 (or empty: no limit)');
    return {next, problems};
  }
  $('open-settings').onclick = showSettings;
  $('s-reset').onclick = () => {
    for (const [k, id] of Object.entries(fields)) $(id).value = DEFAULTS[k];
    $('s-thinking').checked = DEFAULTS.thinking;
  };
  $('settings-form').addEventListener('submit', e => {
    const {next, problems} = readSettings();
    if (problems.length) {
      e.preventDefault();
      $('settings-error').textContent = problems.join('; ') + '.';
      $('settings-error').hidden = false;
      return;
    }
    next.max_tokens = Number(next.max_tokens);
    settings = next;
    store(STORE_SETTINGS, settings);
    const key = $('s-key').value.trim();
    const keyChanged = key !== (sessionStorage.getItem('tern.key') || '');
    if (key) sessionStorage.setItem('tern.key', key); else sessionStorage.removeItem('tern.key');
    if (keyChanged) loadModelInfo();
  });

  // Reload or leaving the page mid-answer: keep what streamed so far.
  window.addEventListener('pagehide', () => { if (streaming) saveChats(); });

  // For tests and the curious: the renderer and the request hook.
  window.tern = {renderMarkdown: ternMarkdown.render, decorate, progressText, hooks: testHooks,
    settings: () => settings, info};

  setStreaming(false);
  renderChat();
  loadModelInfo();
  input.focus();
})();
