"""Reference pages generated from what the code already says, so nothing is written twice.

- ``{waymark-commands}``: every management command of Waymark's apps with its ``--help``.
- ``{waymark-openapi}``: every operation of the REST API, its parameters, request body and
  answers, from the OpenAPI schema drf-spectacular serves at /api/v1/schema/.

Both run while Sphinx builds (conf.py has set Django up); neither touches the database.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

APPS = ["workflows", "effects", "timers", "approvals", "webhooks"]
METHODS = ["get", "post", "put", "patch", "delete"]


def _anchor(text: str) -> str:
    return nodes.make_id(text)


def _section(title: str, document: Any) -> nodes.section:
    section = nodes.section(ids=[_anchor(title)], names=[nodes.fully_normalize_name(title)])
    section += nodes.title(text=title)
    document.note_implicit_target(section, section)
    return section


class Commands(SphinxDirective):
    """One section per management command, its help as ``manage.py COMMAND --help`` prints it."""

    def run(self) -> list[nodes.Node]:
        from django.core.management import get_commands, load_command_class

        found = []
        for name, app in sorted(get_commands().items()):
            if app.split(".")[-1] in APPS:
                command = load_command_class(app, name)
                parser = command.create_parser("waymark manage", name)
                # argparse keeps only the program's base name; readers type ./waymark.
                text = parser.format_help().replace("usage: waymark", "usage: ./waymark", 1)
                found.append((name, app, text))
        out: list[nodes.Node] = []
        for name, app, text in found:
            section = _section(name, self.state.document)
            section += nodes.paragraph(text=f"From the {app} app.")
            section += nodes.literal_block(text, text, language="text")
            out.append(section)
        return out


def _schema_id(name: str) -> str:
    return f"schema-{nodes.make_id(name)}"


def _type(schema: dict[str, Any]) -> str:
    """A schema in words; a named one as `Name` (its section under "Schemas")."""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _type(schema["allOf"][0])
    if "oneOf" in schema:
        return " or ".join(_type(option) for option in schema["oneOf"])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " | ".join(str(v) for v in schema["enum"])
    return str(schema.get("type", "object"))


def _paragraph(text: str, schemas: frozenset[str] = frozenset()) -> nodes.paragraph:
    """The schema's Markdown-ish text: `code` as code (a schema's name as a link to its
    section), the rest as it is."""
    paragraph = nodes.paragraph()
    for i, part in enumerate(text.split("`")):
        if not part:
            continue
        if i % 2 == 0:
            paragraph += nodes.Text(part)
        elif part in schemas:
            link = nodes.reference("", "", internal=True, refid=_schema_id(part))
            link += nodes.literal(part, part)
            paragraph += link
        else:
            paragraph += nodes.literal(part, part)
    return paragraph


def _description(parameter: dict[str, Any]) -> str:
    """A parameter's own words; drf-spectacular's list of an enum's labels says nothing the
    type (its values) does not."""
    text = " ".join(str(parameter.get("description", "")).split())
    return "" if text.startswith("* `") else text


def _body(operation: dict[str, Any]) -> str | None:
    content = operation.get("requestBody", {}).get("content", {})
    for media, spec in content.items():
        return f"{_type(spec.get('schema', {}))} ({media})"
    return None


class OpenAPI(SphinxDirective):
    """One section per tag, one entry per operation, read from the generated schema; then
    every named body (the schema's components), which the operations link to."""

    schemas: frozenset[str] = frozenset()

    def run(self) -> list[nodes.Node]:
        from drf_spectacular.generators import SchemaGenerator

        schema = SchemaGenerator().get_schema(request=None, public=True)
        self.schemas = frozenset(schema.get("components", {}).get("schemas", {}))
        by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
        for path, item in schema["paths"].items():
            for method in METHODS:
                if method in item:
                    operation = item[method]
                    tag = (operation.get("tags") or ["other"])[0]
                    by_tag.setdefault(tag, []).append((method.upper(), path, operation))
        out: list[nodes.Node] = []
        for tag in sorted(by_tag):
            section = _section(tag, self.state.document)
            for method, path, operation in by_tag[tag]:
                section += self._operation(method, path, operation)
            out.append(section)
        out.append(self._schemas(schema.get("components", {}).get("schemas", {})))
        return out

    def _schemas(self, schemas: dict[str, dict[str, Any]]) -> nodes.section:
        """Every named body: its fields, their types, which are required or read-only."""
        section = _section("Schemas", self.state.document)
        for name in sorted(schemas):
            spec = schemas[name]
            section += nodes.rubric(name, name, ids=[_schema_id(name)])
            if spec.get("description") and "enum" not in spec:
                section += _paragraph(" ".join(spec["description"].split()), self.schemas)
            if "enum" in spec:
                values = ", ".join(f"`{value}`" for value in spec["enum"])
                section += _paragraph(f"One of {values}.")
            fields = nodes.bullet_list()
            required = set(spec.get("required", []))
            for field, field_spec in spec.get("properties", {}).items():
                notes = [_type(field_spec)]
                if field in required:
                    notes.append("required")
                if field_spec.get("readOnly"):
                    notes.append("read-only")
                if field_spec.get("nullable"):
                    notes.append("may be null")
                line = f"`{field}` ({', '.join(notes)})"
                if _description(field_spec):
                    line += f": {_description(field_spec)}"
                fields += nodes.list_item("", _paragraph(line, self.schemas))
            if len(fields):
                section += fields
        return section

    def _operation(self, method: str, path: str, operation: dict[str, Any]) -> list[nodes.Node]:
        out: list[nodes.Node] = [nodes.rubric(text=f"{method} {path}")]
        for text in filter(None, [operation.get("summary"), operation.get("description")]):
            out.append(_paragraph(text))
        items = nodes.bullet_list()
        for parameter in operation.get("parameters", []):
            required = ", required" if parameter.get("required") else ""
            line = (
                f"`{parameter['name']}` ({parameter['in']}, "
                f"{_type(parameter.get('schema', {}))}{required})"
            )
            if _description(parameter):
                line += f": {_description(parameter)}"
            items += nodes.list_item("", _paragraph(line, self.schemas))
        if len(items):
            out += [nodes.paragraph(text="Parameters:"), items]
        body = _body(operation)
        if body:
            out.append(_paragraph(f"Request body: {body}", self.schemas))
        answers = nodes.bullet_list()
        for status, response in operation.get("responses", {}).items():
            media = response.get("content", {})
            shape = ", ".join(_type(spec.get("schema", {})) for spec in media.values())
            line = f"{status}: {response.get('description', '')}".rstrip(": ")
            if shape:
                line += f" ({shape})"
            answers += nodes.list_item("", _paragraph(line, self.schemas))
        if len(answers):
            out += [nodes.paragraph(text="Answers:"), answers]
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("waymark-commands", Commands)
    app.add_directive("waymark-openapi", OpenAPI)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
