package main

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// show prints v in the -o format: json or yaml from v itself, any other
// (the command's table or text) by text. v is a proto message, a slice of
// them, or a value encoding/json marshals; messages use protojson's field
// names, so that json and yaml read as the API documents them.
func (e *env) show(v any, text func(w io.Writer) error) error {
	switch e.output {
	case "json", "yaml":
	default:
		return text(e.stdout)
	}
	b, err := marshalJSON(v)
	if err != nil {
		return err
	}
	if e.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = e.stdout.Write(b)
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n", b)
	return err
}

// marshalJSON is v as indented JSON.
func marshalJSON(v any) ([]byte, error) {
	raw, err := toRaw(v)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(raw, "", "  ")
}

// toRaw turns proto messages (alone or in a slice) into protojson's
// encoding; other values pass through for encoding/json.
func toRaw(v any) (any, error) {
	if m, ok := v.(proto.Message); ok {
		b, err := protojson.Marshal(m)
		return json.RawMessage(b), err
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice || !rv.Type().Elem().Implements(reflect.TypeFor[proto.Message]()) {
		return v, nil
	}
	out := make([]json.RawMessage, 0, rv.Len())
	for i := range rv.Len() {
		b, err := protojson.Marshal(rv.Index(i).Interface().(proto.Message))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
