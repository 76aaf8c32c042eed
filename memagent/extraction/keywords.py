"""The extraction job's JSON Schema vocabulary, owned by the resolver (:mod:`memagent.extraction.resolve`).

One list per decision, so that what a schema means is decided in one place:

- what a user's schema may say: :data:`KNOWN` keywords carry meaning (structure, constraints, text), every
  other one is an annotation; :data:`REFUSED` constructs cannot be columns; a union held as JSON text also
  keeps :data:`MAP_KEYWORDS`; formats the grammar has no rule for become
  :data:`memagent.engines.json_schema.FORMAT_PATTERNS`;
- what the resolver writes, the *derived* schema :mod:`memagent.extraction.parse` reads: per kind of node
  (the top, a leaf property, a record type, an object), the keywords it may hold (``x-`` ones aside).
  :mod:`memagent.extraction.parse` refuses anything else: a broken promise of the resolver, or a derived
  schema written by hand.
"""

from __future__ import annotations

SCALARS = ("string", "number", "integer", "boolean")
KIND = "x-kind"  # the column kind of a union (kinds.kind_of reads it)

# A user's schema: the keywords that carry meaning; anything else is an annotation.
STRUCTURE = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                       "additionalProperties", "nullable", "x-key"})
CONSTRAINTS = frozenset({"format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                         "pattern", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems"})
TEXT = frozenset({"description"})
KNOWN = STRUCTURE | CONSTRAINTS | TEXT
REFUSED = {"not": "negation", "if": "a conditional", "then": "a conditional", "else": "a conditional",
           "patternProperties": "properties named by a pattern", "dependentSchemas": "a dependent schema",
           "prefixItems": "a tuple", "propertyNames": "a property-name schema", "contains": "an array 'contains'",
           "unevaluatedItems": "unevaluatedItems"}
MAP_KEYWORDS = frozenset({"minProperties", "maxProperties"})  # kept inside a union held as JSON text (maps allowed)
# Keywords of the user's schema that are neither meaning nor an annotation worth listing.
UNLISTED = frozenset({"title", "$schema", "$id", "$defs", "definitions", "$comment", "x-link", KIND,
                      "x-pydantic-model"})

# The derived schema, per kind of node: what the resolver writes there.
TOP_KEYWORDS = frozenset({"type", "properties", "required", "description", "title", "$schema", "$id",
                          "additionalProperties"})
PROPERTY_KEYWORDS = frozenset({"type", "description", "title", "enum", "items", "anyOf"}) | CONSTRAINTS
RECORD_KEYWORDS = frozenset({"type", "items", "description", "title", "x-key", "x-key-default"})
OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "description", "title", "additionalProperties"})
