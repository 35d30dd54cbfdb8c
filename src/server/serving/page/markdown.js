// A small markdown renderer for model answers. Safety comes first: every piece of source text is HTML-escaped
// before any markup is added, links keep only http(s), mailto, relative and #fragment targets, and the only tags
// in the output are the ones written below. It renders half-finished text too (an unclosed ``` fence is a code
// block so far), since answers are re-rendered while they stream.
'use strict';
const ternMarkdown = (() => {
  const escapeHtml = s => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;').replace(/'/g, '&#39;');

  // Link targets arrive HTML-escaped; decode only to check the scheme.
  function safeHref(escapedUrl) {
    const raw = escapedUrl.replace(/&amp;/g, '&').trim();
    // Browsers drop leading C0 controls and tabs/newlines anywhere before reading the scheme ("\x01javascript:"
    // is javascript:), so a target holding any control character is refused outright.
    if (/[\u0000-\u001f\u007f]/.test(raw)) return null;
    if (/^(https?:|mailto:)/i.test(raw) || /^[#/.]/.test(raw) || !/^[a-z][a-z0-9+.-]*:/i.test(raw)) return escapedUrl.trim();
    return null;  // javascript:, data:, vbscript: and any other scheme
  }

  // A formula (already HTML-escaped) as a span that app.js hands to KaTeX; without KaTeX it shows as written.
  const math = (tex, display) => '<span class="math' + (display ? ' display' : '') + '">' + tex + '</span>';

  // Inline markup on one escaped text run: code spans first (their content is left alone), then links, then
  // emphasis. Code spans and links go into placeholders so that emphasis never reaches inside them.
  function inline(text) {
    const held = [];
    const hold = html => '\u0000' + (held.push(html) - 1) + '\u0000';
    let s = escapeHtml(text);
    s = s.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, __, code) => hold('<code>' + code.trim() + '</code>'));
    // Math ($$..$$, \[..\], \(..\), $..$) becomes a span holding the formula's source, for KaTeX to render
    // afterwards (app.js); emphasis and links must not reach inside it. A single $ needs no space inside it and
    // no digit after it, so "costs $5 and $10" stays text.
    s = s.replace(/\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\]|\\\(([\s\S]+?)\\\)|\$((?=[^\s$])[^$\n]*?[^\s$\\]|[^\s$\\])\$(?!\d)/g,
      (_, display, bracket, paren, dollar) => hold(math(display ?? bracket ?? paren ?? dollar, display != null || bracket != null)));
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (m, label, url) => {
      const href = safeHref(url);
      return href === null ? m : hold('<a href="' + href + '" target="_blank" rel="noopener noreferrer">' + label + '</a>');
    });
    s = s.replace(/\bhttps?:\/\/[^\s<\u0000]*[^\s<.,;:!?)\u0000'"]/g, url =>
      hold('<a href="' + url + '" target="_blank" rel="noopener noreferrer">' + url + '</a>'));
    s = s.replace(/(\*\*|__)(?=\S)([\s\S]*?\S)\1/g, '<strong>$2</strong>');
    s = s.replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?![*\w])/g, '$1<em>$2</em>');
    s = s.replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?![_\w])/g, '$1<em>$2</em>');
    s = s.replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => held[+i]);
  }

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  // An unclosed fence (an answer still streaming) is marked data-open: highlighting waits for it to close.
  function codeBlock(lang, code, closed = true) {
    const l = escapeHtml(lang);
    return '<div class="code"><div class="code-head"><span>' + (l || 'code') + '</span>' +
      '<button type="button" class="copy">Copy</button></div><pre' + (closed ? '' : ' data-open') + '><code' +
      (l ? ' class="language-' + l + '"' : '') +
      '>' + escapeHtml(code) + '</code></pre></div>';
  }

  function cells(line) {
    let t = line.trim();
    if (t.startsWith('|')) t = t.slice(1);
    if (t.endsWith('|') && !t.endsWith('\\|')) t = t.slice(0, -1);
    return t.split(/(?<!\\)\|/).map(c => c.trim().replace(/\\\|/g, '|'));
  }

  function table(header, sep, rows) {
    const align = cells(sep).map(c => c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : '');
    const cell = (tag, c, i) => '<' + tag + (align[i] ? ' style="text-align:' + align[i] + '"' : '') + '>' + inline(c) + '</' + tag + '>';
    let h = '<table><thead><tr>' + cells(header).map((c, i) => cell('th', c, i)).join('') + '</tr></thead><tbody>';
    for (const r of rows) h += '<tr>' + cells(r).map((c, i) => cell('td', c, i)).join('') + '</tr>';
    return h + '</tbody></table>';
  }

  // Consecutive list lines; nesting follows indentation (a deeper indent opens a list inside the last item).
  function list(lines) {
    let html = '';
    const stack = [];  // {indent, tag}
    for (const line of lines) {
      const m = ITEM.exec(line);
      if (!m) {  // a continuation line of the last item
        html += '<br>' + inline(line.trim());
        continue;
      }
      const indent = m[1].replace(/\t/g, '    ').length, tag = /\d/.test(m[2]) ? 'ol' : 'ul';
      while (stack.length && indent < stack[stack.length - 1].indent) html += '</li></' + stack.pop().tag + '>';
      const top = stack[stack.length - 1];
      if (!top || indent > top.indent) {
        const start = tag === 'ol' && parseInt(m[2], 10) !== 1 ? ' start="' + parseInt(m[2], 10) + '"' : '';
        stack.push({indent, tag});
        html += '<' + tag + start + '><li>';
      } else {
        if (top.tag !== tag) {
          html += '</li></' + stack.pop().tag + '><' + tag + '><li>';
          stack.push({indent, tag});
        } else {
          html += '</li><li>';
        }
      }
      html += inline(m[3]);
    }
    while (stack.length) html += '</li></' + stack.pop().tag + '>';
    return html;
  }

  function render(src) {
    const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
    let out = '', para = [];
    const flush = () => {
      if (para.length) out += '<p>' + para.map(inline).join('<br>') + '</p>';
      para = [];
    };
    for (let i = 0; i < lines.length;) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        flush();
        const fence = m[1], body = [];
        const close = new RegExp('^ {0,3}' + fence[0] + '{' + fence.length + ',}\\s*$');
        for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
        const closed = i < lines.length;
        i++;  // past the closing fence (or the end)
        out += codeBlock(m[2], body.join('\n'), closed);
        continue;
      }
      // A display formula on lines of its own ($$ or \[ alone on the first line) is one block, kept as written
      // for KaTeX (a paragraph would split it at its line breaks).
      if ((m = /^\s*(\$\$|\\\[)\s*$/.exec(line))) {
        flush();
        const end = m[1] === '$$' ? '$$' : '\\]', body = [];
        for (i++; i < lines.length && lines[i].trim() !== end; i++) body.push(lines[i]);
        i++;
        out += math(escapeHtml(body.join('\n')), true);
        continue;
      }
      if (!line.trim()) { flush(); i++; continue; }
      if ((m = HEADING.exec(line))) {
        flush();
        out += '<h' + m[1].length + '>' + inline(m[2]) + '</h' + m[1].length + '>';
        i++;
        continue;
      }
      if (RULE.test(line)) { flush(); out += '<hr>'; i++; continue; }
      if (QUOTE.test(line)) {
        flush();
        const body = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i++) body.push(m[1]);
        out += '<blockquote>' + render(body.join('\n')) + '</blockquote>';
        continue;
      }
      if (ITEM.test(line) && !RULE.test(line)) {
        flush();
        const body = [];
        for (; i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) &&
               (ITEM.test(lines[i]) || /^\s+\S/.test(lines[i])); i++) body.push(lines[i]);
        out += list(body);
        continue;
      }
      if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes('-')) {
        flush();
        const header = line, sep = lines[i + 1], rows = [];
        for (i += 2; i < lines.length && lines[i].includes('|') && lines[i].trim(); i++) rows.push(lines[i]);
        out += table(header, sep, rows);
        continue;
      }
      para.push(line);
      i++;
    }
    flush();
    return out;
  }

  return {render, escapeHtml};
})();
