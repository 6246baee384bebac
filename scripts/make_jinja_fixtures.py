#!/usr/bin/env python3
"""Writes tests/fixtures/template/jinja_cases.json: expected renders of Jinja
templates by Python's jinja2, set up as transformers' apply_chat_template sets
it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson without sorting or HTML escaping, raise_exception).

  python3 -m venv /tmp/jv && /tmp/jv/bin/pip install jinja2
  /tmp/jv/bin/python scripts/make_jinja_fixtures.py

Each case: {name, template (source, or "@file.jinja" in the same folder),
context, expected} or, where jinja2 raises, {..., error: message,
message_matches: whether Loom's message must contain it}.
"""
import json
import pathlib

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

FOLDER = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/template"


def environment(trim=True):
    env = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# (name, template, context); templates are small, one construct each.
CONSTRUCTS = [
    ("text_and_output", "Hello {{ name }}!", {"name": "Loom"}),
    ("comment", "a{# gone #}b", {}),
    ("whitespace_minus", "a  {{- x -}}  b\n{%- if true -%}\n  c  \n{%- endif -%}\n d", {"x": 1}),
    ("whitespace_comment_minus", "a \n{#- c -#}\n b", {}),
    ("trim_and_lstrip", "<ul>\n  {% for i in items %}\n  <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n", {"items": [1, 2]}),
    ("plus_disables_lstrip", "x\n  {%+ if true %}y{% endif %}", {}),
    ("variable_tags_not_lstripped", "x\n  {{ 1 }}\n", {}),
    ("raw", "{% raw %}{{ not }} {% evaluated %}{% endraw %}\nafter", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};{% endfor %}", {}),
    ("for_loop_variables",
     "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_previtem_nextitem", "{% for x in [1, 2, 3] %}{{ loop.previtem|default('^') }}{{ x }}{{ loop.nextitem|default('$') }} {% endfor %}", {}),
    ("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in missing %}{{ x }}{% else %}none{% endfor %}", {}),
    ("for_unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for (a, b) in [[1, 2]] %}{{ a + b }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ '/' ~ loop.length if loop.last }},{% endfor %}", {}),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("for_scope", "{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}", {}),
    ("loop_cycle", "{% for i in range(4) %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("set_and_tuple", "{% set a, b = 1, 'two' %}{% set c = [a, b] %}{{ a }} {{ b }} {{ c }}", {}),
    ("set_block", "{% set greeting %}  Hi {{ name }}  {% endset %}[{{ greeting }}]{% set t | trim | upper %}  x  {% endset %}[{{ t }}]", {"name": "you"}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in [1, 5, 2] %}{% set ns.count = ns.count + x %}{% if x > 3 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("macro_defaults_and_kwargs",
     "{% macro f(a, b=2, c='c') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ f(1) }} {{ f(1, 3) }} {{ f(1, c='z') }} {{ f(a=0, b=none) }}", {}),
    ("macro_varargs_kwargs", "{% macro f(a) %}{{ a }}{{ varargs | list }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3) }} {{ f(1, k='v') }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_sees_template_variables", "{% set prefix = '> ' %}{% macro quote(x) %}{{ prefix }}{{ x }}{% endmacro %}{{ quote('hi') }}", {}),
    ("call_block", "{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}{% call box('t') %}inside{% endcall %}", {}),
    ("filter_block", "{% filter upper %}shout {{ x }}{% endfilter %}", {"x": "this"}),
    ("arithmetic", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }}", {}),
    ("string_operators", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 'x' ~ 1 ~ none ~ true }} {{ [1] + [2] }} {{ [0] * 3 }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ [1, 2] == [1, 2] }}", {}),
    ("logic", "{{ true and false }} {{ true or false }} {{ not true }} {{ 0 or 'fallback' }} {{ 'x' and 'y' }} {{ none or [] }} {{ not x is defined }}", {}),
    ("membership", "{{ 'a' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'z' not in 'abc' }}", {}),
    ("ternary", "{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'only' if false }}]", {"x": True}),
    ("literals", "{{ [1, 'a', none, true, 2.5, {'k': [false]}] }} {{ {'b': 1, 'a': 2} }} {{ (1, 2) | list }} {{ (1,) | length }} {{ () | length }} {{ 'it\\'s' }} {{ \"q\\\"\" }} {{ 'tab\\there' }}", {}),
    ("string_concatenation_literals", "{{ 'a' 'b' \"c\" }}", {}),
    ("subscripts_and_slices",
     "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ d['k'] }} {{ d.k }} {{ xs.0 }} [{{ xs[10] }}]",
     {"xs": [1, 2, 3, 4], "s": "héllo", "d": {"k": "v"}}),
    ("attribute_chain", "{{ m.a.b }} [{{ m.a.missing }}] {{ m['a']['b'] }}", {"m": {"a": {"b": "deep"}}}),
    ("printing", "{{ none }} {{ true }} {{ false }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 0.00001 }} {{ 123456789 }} {{ -0.5 }} {{ 2.5e-3 }} [{{ undefined_name }}]", {}),
    ("tojson", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ [] | tojson(indent=2) }} {{ 'é\"\\n' | tojson }} {{ 1.0 | tojson }} {{ none | tojson }}",
     {"d": {"zeta": 1, "alpha": [True, None, 2.5, "x"], "empty": {}}}),
    ("trim_length_count", "[{{ '  x  ' | trim }}] {{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ missing | length }} [{{ 'xxhixx' | trim('x') }}]", {}),
    ("items_keys_values", "{{ d | items | map('join', '=') | join(',') }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz', 'default') }} {{ d.get('zz') }}", {"d": {"b": 1, "a": 2}}),
    ("first_last_join", "{{ xs | first }} {{ xs | last }} {{ xs | join(', ') }} {{ 'abc' | first }} {{ users | join('/', attribute='name') }}",
     {"xs": [3, 1, 2], "users": [{"name": "a"}, {"name": "b"}]}),
    ("case_filters", "{{ 'hello wORLD' | upper }} {{ 'Hello' | lower }} {{ 'hello-world foo' | title }} {{ 'hELLO world' | capitalize }}", {}),
    ("replace_filter", "{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }}", {}),
    ("default_filter", "{{ missing | default('d') }} {{ missing | d('d2') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ 0 | default(5, boolean=true) }}", {}),
    ("list_filter", "{{ 'ab' | list }} {{ {'k': 1} | list }} {{ range(3) | list }}", {}),
    ("selectattr_rejectattr",
     "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ ms | rejectattr('role', 'equalto', 'user') | list | length }} {{ ms | selectattr('tool') | list | length }} {{ ms | selectattr('tool', 'defined') | list | length }} {{ ms | rejectattr('tool', 'undefined') | map(attribute='tool') | first }} {{ ms | selectattr('content', 'string') | list | length }} {{ ms | selectattr('tool', 'none') | list | length }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": "t"}, {"role": "user", "content": "c", "tool": None}]}),
    ("select_reject", "{{ range(6) | select('even') | list }} {{ range(6) | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 2, 3] | select('>', 1) | list }}", {}),
    ("map_filter", "{{ ['a', 'b'] | map('upper') | join }} {{ xs | map(attribute='n') | list }} {{ xs | map(attribute='m', default=0) | list }} {{ ['1', '2'] | map('int') | sum }}",
     {"xs": [{"n": 1}, {"n": 2, "m": 5}]}),
    ("conversion_filters", "{{ 3 | string }}{{ none | string }} {{ '42' | int + 1 }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.7 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 'x' | float }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("round_filter", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 3.14159 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}", {}),
    ("safe_escape", "{{ '<b>&\"\\'' | escape }} {{ '<b>' | e }} {{ '<b>' | safe }}", {}),
    ("indent_filter", "[{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}] [{{ 'a\\n\\nb' | indent(2, blank=true) }}] [{{ 'x\\n' | indent(3) }}]", {}),
    ("batch_unique_sort_dictsort",
     "{{ range(5) | batch(2) | list }} {{ range(5) | batch(2, 'x') | list }} {{ ['b', 'A', 'a', 'b'] | unique | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ users | sort(attribute='age') | map(attribute='name') | join }} {{ {'b': 1, 'a': 2} | dictsort | map('join', ':') | join }} {{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) | map('first') | join }}",
     {"users": [{"name": "x", "age": 30}, {"name": "y", "age": 20}]}),
    ("other_filters", "{{ [1, 2, 3] | sum }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} {{ 'a b  c' | wordcount }}", {}),
    ("tests",
     "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ 1 is integer }} {{ 1.0 is integer }} {{ 1.5 is float }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is equalto 'a' }} {{ 1 is eq 2 }} {{ 1 is ne 2 }} {{ 2 is gt 1 }} {{ 2 is le 1 }} {{ 2 is in [1, 2] }} {{ 'x' is not string }} {{ none is sameas none }} {{ f is callable }} {{ 'abc' is lower }} {{ 'ABC' is upper }}",
     {"x": 0}),
    ("string_methods",
     "[{{ '  a b  '.strip() }}] [{{ '  a '.lstrip() }}] [{{ ' a  '.rstrip() }}] [{{ 'xxaxx'.strip('x') }}] {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'a-b'.replace('-', '+') }} {{ 'hello wORLD'.title() }} {{ \"it's\".title() }} {{ 'hELLO'.capitalize() }} {{ '{}-{}'.format('a', 1) }} {{ '{0}{name}'.format('x', name='y') }} {{ ', '.join(['a', 'b']) }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ 'a\\nb'.splitlines() }} {{ '12'.isdigit() }}",
     {}),
    ("globals", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
    ("operator_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ (1 + 1) ~ 'x' }} {{ 'a' ~ 2 * 3 }} {{ -x | abs }}", {"x": 3}),
    ("filter_then_test", "{{ xs | length is odd }} {{ xs | selectattr('a') | list | length > 0 }}", {"xs": [{"a": 1}]}),
    ("multiline_expression", "{{\n  a\n  +\n  b\n}}", {"a": 1, "b": 2}),
    ("trailing_newline_dropped", "line\n", {}),
    ("crlf_newlines", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("dict_literal_in_output", "{{ {'a': {'b': 1}} }}{{ {'x': 1}['x'] }}", {}),
    ("unicode", "{{ s | length }} {{ s[0] }} {{ s | upper }} {{ s | tojson }} {{ s[-2:] }}", {"s": "日本語テキスト"}),
]

ERRORS = [
    ("raise_exception", "line one\n{{ raise_exception('Roles must alternate') }}", {}),
    ("undefined_call", "{{ nothing.strip() }}", {}),
    ("bad_operands", "{{ 'a' + 1 }}", {}),
]

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi there"}],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "  4  "},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "Thanks"},
    ],
    "tool_calls": [
        {"role": "system", "content": "You can check the weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21°C in Paris."},
        {"role": "user", "content": "And Rome?"},
    ],
    "two_tool_results": [
        {"role": "user", "content": "Compare Paris and Rome"},
        {"role": "assistant", "content": "Checking both.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "21"},
        {"role": "tool", "content": "25"},
    ],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
    },
}]

CHAT_CASES = [
    ("chatml_tools", "plain", {}), ("chatml_tools", "system", {}), ("chatml_tools", "multi_turn", {}),
    ("chatml_tools", "tool_calls", {"tools": TOOLS}), ("chatml_tools", "two_tool_results", {"tools": TOOLS}),
    ("chatml_tools", "multi_turn", {"add_generation_prompt": False}),
    ("llama31_tools", "plain", {}), ("llama31_tools", "system", {"date_string": "01 Jan 2025"}),
    ("llama31_tools", "multi_turn", {}), ("llama31_tools", "tool_calls", {"tools": TOOLS}),
    ("llama31_tools", "tool_calls", {"tools": TOOLS, "tools_in_user_message": False}),
    ("llama31_tools", "two_tool_results", {"tools": TOOLS}),
    ("mistral_inst", "plain", {}), ("mistral_inst", "system", {}), ("mistral_inst", "multi_turn", {}),
    ("mistral_inst", "not_alternating", {}), ("mistral_inst", "tool_calls", {}),
]


def render(env, source, context):
    try:
        return {"expected": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as error:
        # raise_exception's and undefined names' messages are ours too; other errors are worded differently.
        matches = type(error) is jinja2.exceptions.TemplateError or isinstance(error, jinja2.exceptions.UndefinedError)
        return {"error": str(error), "message_matches": matches}
    except TypeError as error:
        return {"error": str(error), "message_matches": False}


def main():
    env = environment()
    cases = []
    for name, source, context in CONSTRUCTS + ERRORS:
        cases.append({"name": name, "template": source, "context": context, **render(env, source, context)})
    for template_name, conversation, extra in CHAT_CASES:
        source = (FOLDER / f"{template_name}.jinja").read_text()
        context = {"messages": CONVERSATIONS[conversation], "bos_token": "<s>", "eos_token": "</s>",
                   "add_generation_prompt": True, **extra}
        name = f"{template_name}/{conversation}" + "".join(f"/{key}" for key in extra if key != "tools")
        if "tools" in extra:
            name += "/tools"
        cases.append({"name": name, "template": f"@{template_name}.jinja", "context": context, **render(env, source, context)})
    untrimmed = environment(trim=False)
    for name, source, context in [("untrimmed_defaults", "<ul>\n  {% for i in items %}\n  <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n", {"items": [1, 2]})]:
        cases.append({"name": name, "template": source, "context": context, "trim_blocks": False, **render(untrimmed, source, context)})
    (FOLDER / "jinja_cases.json").write_text(json.dumps({"jinja2_version": jinja2.__version__, "cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} errors")


if __name__ == "__main__":
    main()
