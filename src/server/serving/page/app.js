// tern's chat page: chats kept in localStorage, answers streamed from /v1/chat/completions (SSE), Stop aborts the
// fetch (the server cancels a generation whose client went away), thinking shown apart and collapsible, errors
// shown as errors, tok/s and time to first token per answer; until the first token, where the request stands (the
// server's prompt_progress: waiting in its queue, or reading the prompt). Messages can be copied, deleted, edited
// and resent; the last answer regenerated. New chat, switching and deleting chats stop a streaming answer first
// (deleting asks).
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
  const saveChats = () => { store(STORE_CHATS, chats); store(STORE_CURRENT, current ? current.id : null); };

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

  // One message's element (its message in box.msg); assistant messages keep handles to update while streaming.
  function messageView(m) {
    if (m.role === 'user' || m.role === 'error') {
      const box = el('div', 'msg ' + m.role);
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
    if (!text.trim() || streaming) return;
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

  function apiMessages() {
    const out = [];
    if (settings.system.trim()) out.push({role: 'system', content: settings.system});
    for (const m of current.messages) {
      if (m.role === 'user') out.push({role: 'user', content: m.content});
      else if (m.role === 'assistant' && m.content) out.push({role: 'assistant', content: m.content});
    }
    return out;
  }

  function requestBody() {
    const b = {messages: apiMessages(), stream: true, stream_options: {include_usage: true}, return_progress: true,
      max_tokens: Math.max(1, parseInt(settings.max_tokens, 10) || DEFAULTS.max_tokens),
      chat_template_kwargs: {enable_thinking: !!settings.thinking}};
    if (settings.temperature !== '' && settings.temperature != null) b.temperature = Number(settings.temperature);
    if (settings.top_p !== '' && settings.top_p != null) b.top_p = Number(settings.top_p);
    if (settings.thinking && settings.thinking_budget !== '' && settings.thinking_budget != null)
      b.thinking_budget = Number(settings.thinking_budget);
    Object.assign(b, testHooks.extraBody || {});
    testHooks.lastBody = b;  // what was last sent, for tests
    return b;
  }

  async function errorOf(res) {
    const text = await res.text();
    try {
      const j = JSON.parse(text);
      if (j.error && j.error.message) return {message: j.error.message, code: j.error.code};
    } catch { /* not JSON */ }
    return {message: text.trim() || res.statusText, code: null};
  }

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

  async function send(text) {
    if (streaming || !text.trim()) return;
    if (!current) {
      current = {id: newId(), title: '', messages: [], updated: Date.now()};
      chats.push(current);
    }
    if (!current.title) current.title = text.trim().split('\n')[0].slice(0, 60);
    if (!current.messages.length) log.replaceChildren();
    const user = {role: 'user', content: text};
    current.messages.push(user);
    log.append(messageView(user));
    return ask();
  }

  // Streams an answer to the current chat as it stands (its last message is a question).
  async function ask() {
    if (streaming || !current) return;
    const body = requestBody();
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
    try {
      const res = await fetch('/v1/chat/completions', {method: 'POST', signal: controller.signal,
        headers: Object.assign({'Content-Type': 'application/json'}, authHeaders()), body: JSON.stringify(body)});
      if (!res.ok) {
        failed = true;
        const err = await errorOf(res);
        if (res.status === 400 && err.code === 'context_length_exceeded') addError(chat, contextError(err.message));
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
    const text = input.value;
    if (!text.trim()) return;
    input.value = '';
    grow();
    send(text);
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
  document.addEventListener('keydown', e => { if (e.key === 'Escape' && streaming) stop(); });

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
