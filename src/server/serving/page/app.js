// tern's chat page: chats kept in localStorage, answers streamed from /v1/chat/completions (SSE), Stop aborts the
// fetch (the server cancels a generation whose client went away), thinking shown apart and collapsible, errors
// shown as errors, tok/s and time to first token per answer. No network but this server's own API.
'use strict';
(() => {
  const $ = id => document.getElementById(id);
  const log = $('log'), input = $('input'), sendBtn = $('send'), stopBtn = $('stop');
  const STORE_CHATS = 'tern.chats', STORE_CURRENT = 'tern.current', STORE_SETTINGS = 'tern.settings';
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

  function statsText(m) {
    const s = m.stats || {}, parts = [];
    if (s.tok_s != null) parts.push(s.tok_s.toFixed(1) + ' tok/s');
    if (s.ttft_s != null) parts.push('first token ' + s.ttft_s.toFixed(2) + ' s');
    if (s.completion_tokens != null) parts.push(s.completion_tokens + ' tokens');
    if (s.prompt_tokens != null) parts.push('prompt ' + s.prompt_tokens + (s.cached_tokens ? ' (' + s.cached_tokens + ' cached)' : ''));
    if (s.finish) parts.push(s.finish);
    return parts.join(' · ');
  }

  // One message's element; assistant messages keep handles to update while streaming.
  function messageView(m) {
    if (m.role === 'user') return el('div', 'msg user', m.content);
    if (m.role === 'error') return el('div', 'msg error', m.content);
    const box = el('div', 'msg assistant');
    const think = el('details', 'thinking'), summary = el('summary'), body = el('div', 'body');
    think.append(summary, body);
    const content = el('div', 'content'), meta = el('div', 'meta');
    box.append(think, content, meta);
    const view = {box, think, summary, body, content, meta, userToggled: false};
    // The user's choice counts from the click itself ('toggle' events arrive later, after a render may have run).
    summary.addEventListener('click', () => { view.userToggled = true; });
    view.update = (streaming) => {
      box.classList.toggle('streaming', streaming);
      think.hidden = !m.reasoning;
      if (m.reasoning) {
        body.textContent = m.reasoning;
        const thinkingNow = streaming && !m.content;
        summary.textContent = (thinkingNow ? 'Thinking… ' : 'Thought · ') + (m.reasoning_tokens || 0) + ' tokens';
        // Open while it thinks, folded once the answer starts, unless the user chose.
        if (!view.userToggled && think.open !== thinkingNow) think.open = thinkingNow;
      }
      content.innerHTML = ternMarkdown.render(m.content || '');
      meta.textContent = statsText(m);
    };
    view.update(false);
    box.view = view;
    return box;
  }

  function renderChat() {
    log.replaceChildren();
    const msgs = current ? current.messages : [];
    if (!msgs.length) {
      const hint = el('div', 'muted', 'Ask anything. Enter sends, Shift+Enter adds a line, Esc stops.');
      hint.id = 'empty';
      log.append(hint);
    }
    for (const m of msgs) log.append(messageView(m));
    stick = true;
    follow();
    renderChatList();
  }

  function renderChatList() {
    const ul = $('chat-list');
    ul.replaceChildren();
    for (const c of [...chats].sort((a, b) => b.updated - a.updated)) {
      const li = el('li', c === current ? 'current' : '');
      const title = el('span', 'title', c.title || 'New chat');
      title.title = c.title || '';
      title.onclick = () => { if (!streaming) { current = c; saveChats(); renderChat(); closeDrawer(); } };
      const del = el('button', 'del', '\u00d7');
      del.type = 'button';
      del.title = 'Delete this chat';
      del.onclick = () => {
        if (streaming && c === current) return;
        chats = chats.filter(x => x !== c);
        if (current === c) current = null;
        saveChats();
        renderChat();
      };
      li.append(title, del);
      ul.append(li);
    }
  }

  // Copy buttons of code blocks (event delegation: blocks are re-rendered while streaming).
  log.addEventListener('click', async e => {
    const btn = e.target.closest('button.copy');
    if (!btn) return;
    const code = btn.closest('.code').querySelector('code').textContent;
    let ok = false;
    try { await navigator.clipboard.writeText(code); ok = true; } catch {
      const t = el('textarea');  // plain-http pages on another host have no clipboard API
      t.value = code;
      document.body.append(t);
      t.select();
      try { ok = document.execCommand('copy'); } catch { ok = false; }
      t.remove();
    }
    btn.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  });

  // ---- sending --------------------------------------------------------------------------------------------
  let streaming = null;  // {controller} while an answer streams
  const testHooks = {extraBody: null};  // tests merge fields into the request body (e.g. a forced output)

  function authHeaders() {
    const h = {};
    const key = sessionStorage.getItem('tern.key');
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  function setStreaming(on) {
    sendBtn.disabled = on;
    stopBtn.disabled = !on;
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
    const b = {messages: apiMessages(), stream: true, stream_options: {include_usage: true},
      max_tokens: Math.max(1, parseInt(settings.max_tokens, 10) || DEFAULTS.max_tokens),
      chat_template_kwargs: {enable_thinking: !!settings.thinking}};
    if (settings.temperature !== '' && settings.temperature != null) b.temperature = Number(settings.temperature);
    if (settings.top_p !== '' && settings.top_p != null) b.top_p = Number(settings.top_p);
    if (settings.thinking && settings.thinking_budget !== '' && settings.thinking_budget != null)
      b.thinking_budget = Number(settings.thinking_budget);
    return Object.assign(b, testHooks.extraBody || {});
  }

  async function errorMessage(res) {
    const text = await res.text();
    try { const j = JSON.parse(text); if (j.error && j.error.message) return j.error.message; } catch { /* not JSON */ }
    return text.trim() || res.statusText;
  }

  function addError(text) {
    const m = {role: 'error', content: text};
    current.messages.push(m);
    log.append(messageView(m));
    follow();
  }

  async function send(text) {
    if (streaming || !text.trim()) return;
    if (!current) {
      current = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 7), title: '', messages: [], updated: Date.now()};
      chats.push(current);
    }
    if (!current.title) current.title = text.trim().split('\n')[0].slice(0, 60);
    if (!current.messages.length) log.replaceChildren();
    const user = {role: 'user', content: text};
    current.messages.push(user);
    log.append(messageView(user));
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
    streaming = {controller};
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
        addError((j.error.message || 'The server reported an error.') + (j.error.type ? ' (' + j.error.type + ')' : ''));
        return;
      }
      if (j.usage) usage = j.usage;
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
        addError('HTTP ' + res.status + ': ' + await errorMessage(res));
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
      else { failed = true; addError('Connection failed: ' + e.message); }
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
    if (chat === current) input.focus();
  }

  function stop() { if (streaming) streaming.controller.abort(); }

  // ---- composer ----------------------------------------------------------------------------------------------
  const grow = () => { input.style.height = 'auto'; input.style.height = input.scrollHeight + 2 + 'px'; };
  input.addEventListener('input', grow);
  input.addEventListener('keydown', e => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
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
  document.addEventListener('keydown', e => { if (e.key === 'Escape' && streaming) stop(); });

  // ---- chats, drawer, settings ---------------------------------------------------------------------------------
  const closeDrawer = () => { $('sidebar').classList.remove('open'); $('scrim').hidden = true; };
  $('menu').onclick = () => { $('sidebar').classList.add('open'); $('scrim').hidden = false; };
  $('scrim').onclick = closeDrawer;
  $('new-chat').onclick = () => {
    if (streaming) return;
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
  window.tern = {renderMarkdown: ternMarkdown.render, hooks: testHooks, settings: () => settings, info};

  setStreaming(false);
  renderChat();
  loadModelInfo();
  input.focus();
})();
