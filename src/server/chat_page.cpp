#include "server/chat_page.h"

namespace tern::server {

const std::string& chat_page_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tern</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;max-width:52rem;margin:0 auto;padding:1rem;background:#fafafa}
#log div{white-space:pre-wrap;margin:.5rem 0;padding:.5rem .75rem;border-radius:.5rem}
.user{background:#dbeafe}.assistant{background:#fff;border:1px solid #ddd}
.reasoning{color:#777;font-size:.9em;border-left:3px solid #ccc;padding-left:.5rem;margin-bottom:.4rem}
form{display:flex;gap:.5rem}textarea{flex:1;height:4rem}#status{color:#777;font-size:.85em}
</style></head><body>
<h3>tern</h3>
<div id="log"></div>
<form id="f"><textarea id="q" placeholder="Message (Enter sends, Shift+Enter adds a line)"></textarea>
<button>Send</button></form>
<label><input type="checkbox" id="think" checked> thinking</label>
<label>API key <input type="password" id="key" size="12"></label>
<div id="status"></div>
<script>
const log=document.getElementById('log'),q=document.getElementById('q'),st=document.getElementById('status');
const history=[];
function add(cls){const d=document.createElement('div');d.className=cls;log.appendChild(d);return d;}
q.addEventListener('keydown',e=>{if(e.key==='Enter'&&!e.shiftKey){e.preventDefault();document.getElementById('f').requestSubmit();}});
document.getElementById('f').onsubmit=async e=>{
  e.preventDefault();const text=q.value.trim();if(!text)return;q.value='';
  history.push({role:'user',content:text});add('user').textContent=text;
  const box=add('assistant'),r=document.createElement('div');r.className='reasoning';box.appendChild(r);
  const c=document.createElement('span');box.appendChild(c);
  const headers={'Content-Type':'application/json'};const key=document.getElementById('key').value;
  if(key)headers['Authorization']='Bearer '+key;
  const body={messages:history,stream:true,stream_options:{include_usage:true},
    chat_template_kwargs:{enable_thinking:document.getElementById('think').checked}};
  st.textContent='...';
  try{
    const res=await fetch('/v1/chat/completions',{method:'POST',headers,body:JSON.stringify(body)});
    if(!res.ok){c.textContent=(await res.json()).error.message;st.textContent='';return;}
    const reader=res.body.getReader(),dec=new TextDecoder();let buf='',answer='';
    for(;;){const {value,done}=await reader.read();if(done)break;buf+=dec.decode(value,{stream:true});
      let i;while((i=buf.indexOf('\n\n'))>=0){const line=buf.slice(0,i);buf=buf.slice(i+2);
        if(!line.startsWith('data: '))continue;const data=line.slice(6);if(data==='[DONE]')continue;
        const j=JSON.parse(data);if(j.error){c.textContent+=' ['+j.error.message+']';continue;}
        if(j.usage)st.textContent=j.usage.prompt_tokens+' prompt tokens, '+j.usage.completion_tokens+' generated';
        for(const ch of j.choices||[]){const d=ch.delta||{};
          if(d.reasoning_content)r.textContent+=d.reasoning_content;
          if(d.content){c.textContent+=d.content;answer+=d.content;}
          if(d.tool_calls)c.textContent+=JSON.stringify(d.tool_calls);}}}
    history.push({role:'assistant',content:answer});
  }catch(err){c.textContent+=' ['+err+']';}
};
</script></body></html>
)HTML";
  return page;
}

}  // namespace tern::server
