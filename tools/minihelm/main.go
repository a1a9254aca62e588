// minihelm renders a Helm 3 chart offline with the engine Helm uses (text/template + sprig + Helm's own functions),
// validates the values against values.schema.json (gojsonschema, the library Helm uses) and checks that every
// rendered document is YAML. It exists because helm is not packaged for Debian 12; see tools/minihelm/README.md for
// what differs from `helm template`.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

const usage = `usage:
  minihelm template CHART_DIR [--name NAME] [--namespace NS] [-f VALUES.yaml]... [--set K=V[,K=V]]...
                    [--set-string K=V]... [--include-crds] [--api-versions GROUP/VERSION[,...]]...
                    [--only-api-versions] [--kube-version vMAJOR.MINOR.PATCH] [--notes]
      Prints the rendered manifests (like helm template), or with --notes only the rendered NOTES.txt.
  minihelm yaml2json [FILE...]
      Prints every YAML document of the files (or stdin) as one line of JSON (for jq).
`

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "minihelm: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "template":
		runTemplate(os.Args[2:])
	case "yaml2json":
		runYAML2JSON(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "minihelm: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}

// splitDocs splits a YAML stream at document separators and drops documents that are empty or only comments.
func splitDocs(text string) []string {
	var docs []string
	for _, d := range strings.Split("\n"+text, "\n---") {
		body := strings.TrimSpace(d)
		empty := true
		for _, line := range strings.Split(body, "\n") {
			l := strings.TrimSpace(line)
			if l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

func runYAML2JSON(files []string) {
	inputs := map[string][]byte{}
	names := files
	if len(files) == 0 {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail("stdin: %v", err)
		}
		inputs["-"] = b
		names = []string{"-"}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fail("%v", err)
		}
		inputs[f] = b
	}
	for _, n := range names {
		for i, d := range splitDocs(string(inputs[n])) {
			j, err := yaml.YAMLToJSON([]byte(d))
			if err != nil {
				fail("%s: document %d: %v", n, i+1, err)
			}
			fmt.Println(string(j))
		}
	}
}

type multiFlag []string

type options struct {
	chartDir, name, namespace, kubeVersion    string
	valueFiles, sets, setStrings, apiVersions multiFlag
	includeCRDs, onlyAPIVersions, notes       bool
}

func parseArgs(args []string) options {
	o := options{name: "railyard", namespace: "default", kubeVersion: "v1.27.0"}
	for i := 0; i < len(args); i++ {
		a, val, hasVal := args[i], "", false
		if strings.HasPrefix(a, "--") {
			if eq := strings.Index(a, "="); eq > 0 {
				a, val, hasVal = a[:eq], a[eq+1:], true
			}
		}
		next := func() string {
			if hasVal {
				return val
			}
			if i+1 >= len(args) {
				fail("%s needs a value", a)
			}
			i++
			return args[i]
		}
		switch a {
		case "--name":
			o.name = next()
		case "--namespace", "-n":
			o.namespace = next()
		case "-f", "--values":
			o.valueFiles = append(o.valueFiles, next())
		case "--set":
			o.sets = append(o.sets, next())
		case "--set-string":
			o.setStrings = append(o.setStrings, next())
		case "--api-versions":
			o.apiVersions = append(o.apiVersions, strings.Split(next(), ",")...)
		case "--kube-version":
			o.kubeVersion = next()
		case "--include-crds":
			o.includeCRDs = true
		case "--only-api-versions":
			o.onlyAPIVersions = true
		case "--notes":
			o.notes = true
		default:
			if strings.HasPrefix(a, "-") || o.chartDir != "" {
				fail("unexpected argument %q\n%s", a, usage)
			}
			o.chartDir = a
		}
	}
	if o.chartDir == "" {
		fail("missing CHART_DIR\n%s", usage)
	}
	return o
}

// readYAMLMap parses a YAML file into a map the way Helm does (through JSON, so numbers become float64).
func readYAMLMap(file string) map[string]interface{} {
	b, err := os.ReadFile(file)
	if err != nil {
		fail("%v", err)
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		fail("%s: %v", file, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	return m
}

// mergeValues merges src into dst: maps merge recursively, anything else replaces, null deletes (Helm's rules).
func mergeValues(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// splitUnescaped splits s at sep, except where sep is preceded by a backslash.
func splitUnescaped(s string, sep byte) []string {
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && s[i+1] == sep {
			cur.WriteByte(sep)
			i++
		} else if s[i] == sep {
			parts = append(parts, cur.String())
			cur.Reset()
		} else {
			cur.WriteByte(s[i])
		}
	}
	return append(parts, cur.String())
}

// applySet applies one --set/--set-string argument (a.b=v,c=w; no list-index syntax).
func applySet(values map[string]interface{}, arg string, asString bool) {
	for _, kv := range splitUnescaped(arg, ',') {
		eq := strings.Index(kv, "=")
		if eq <= 0 {
			fail("--set %q: expected KEY=VALUE", kv)
		}
		key, raw := kv[:eq], kv[eq+1:]
		var v interface{} = raw
		if !asString {
			if raw == "true" || raw == "false" {
				v = raw == "true"
			} else if raw == "null" {
				v = nil
			} else if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
				v = n
			}
		}
		path := splitUnescaped(key, '.')
		m := values
		for _, p := range path[:len(path)-1] {
			sub, ok := m[p].(map[string]interface{})
			if !ok {
				sub = map[string]interface{}{}
				m[p] = sub
			}
			m = sub
		}
		last := path[len(path)-1]
		if v == nil {
			delete(m, last)
		} else {
			m[last] = v
		}
	}
}

func validateSchema(chartDir, chartName string, values map[string]interface{}) {
	schemaFile := filepath.Join(chartDir, "values.schema.json")
	schema, err := os.ReadFile(schemaFile)
	if os.IsNotExist(err) {
		return
	} else if err != nil {
		fail("%v", err)
	}
	doc, err := json.Marshal(values)
	if err != nil {
		fail("values: %v", err)
	}
	res, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(doc))
	if err != nil {
		fail("%s: %v", schemaFile, err)
	}
	if !res.Valid() {
		var msgs []string
		for _, e := range res.Errors() {
			msgs = append(msgs, fmt.Sprintf("- %s: %s", e.Field(), e.Description()))
		}
		sort.Strings(msgs)
		fail("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s",
			chartName, strings.Join(msgs, "\n"))
	}
}

// Files is .Files: the chart's files other than templates and values, by path relative to the chart.
type Files map[string][]byte

func (f Files) Get(name string) string      { return string(f[name]) }
func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for k, v := range f {
		if ok, _ := path.Match(pattern, k); ok {
			out[k] = v
		}
	}
	return out
}
func (f Files) AsConfig() string {
	m := map[string]string{}
	for k, v := range f {
		m[path.Base(k)] = string(v)
	}
	b, _ := yaml.Marshal(m)
	return strings.TrimSuffix(string(b), "\n")
}

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

type KubeVersion struct{ Version, Major, Minor, GitVersion string }

func (k KubeVersion) String() string { return k.Version }

type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion map[string]string
}

// The group/versions a current cluster serves (helm template's default without a cluster).
var defaultAPIVersions = []string{"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
	"coordination.k8s.io/v1", "apiextensions.k8s.io/v1", "networking.k8s.io/v1", "autoscaling/v2",
	"events.k8s.io/v1", "storage.k8s.io/v1", "admissionregistration.k8s.io/v1"}

func toYAML(v interface{}) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

func runTemplate(args []string) {
	o := parseArgs(args)
	chartMeta := readYAMLMap(filepath.Join(o.chartDir, "Chart.yaml"))
	str := func(k string) string { s, _ := chartMeta[k].(string); return s }
	if str("name") == "" {
		fail("%s: Chart.yaml has no name", o.chartDir)
	}
	chart := map[string]interface{}{"Name": str("name"), "Version": str("version"), "AppVersion": str("appVersion"),
		"APIVersion": str("apiVersion"), "Description": str("description"), "Type": str("type"),
		"KubeVersion": str("kubeVersion")}

	values := readYAMLMap(filepath.Join(o.chartDir, "values.yaml"))
	for _, f := range o.valueFiles {
		mergeValues(values, readYAMLMap(f))
	}
	for _, s := range o.sets {
		applySet(values, s, false)
	}
	for _, s := range o.setStrings {
		applySet(values, s, true)
	}
	validateSchema(o.chartDir, str("name"), values)

	kv := strings.TrimPrefix(o.kubeVersion, "v")
	parts := strings.SplitN(kv, ".", 3)
	if len(parts) < 2 {
		fail("--kube-version %q: expected vMAJOR.MINOR[.PATCH]", o.kubeVersion)
	}
	apis := VersionSet{}
	if !o.onlyAPIVersions {
		apis = append(apis, defaultAPIVersions...)
	}
	apis = append(apis, o.apiVersions...)
	caps := &Capabilities{KubeVersion: KubeVersion{Version: "v" + kv, Major: parts[0], Minor: parts[1], GitVersion: "v" + kv},
		APIVersions: apis, HelmVersion: map[string]string{"Version": "v3.11.0-minihelm"}}

	files := Files{}
	templates := map[string]string{}
	var crds []string
	err := filepath.Walk(o.chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(o.chartDir, p)
		rel = filepath.ToSlash(rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			templates[str("name")+"/"+rel] = string(b)
		case strings.HasPrefix(rel, "crds/"):
			crds = append(crds, rel)
			files[rel] = b
		case rel == "Chart.yaml" || rel == "values.yaml" || rel == "values.schema.json" || rel == ".helmignore":
		default:
			files[rel] = b
		}
		return nil
	})
	if err != nil {
		fail("%v", err)
	}

	t := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	includeDepth := 0
	funcs["include"] = func(name string, data interface{}) (string, error) {
		includeDepth++
		defer func() { includeDepth-- }()
		if includeDepth > 1000 {
			return "", fmt.Errorf("include %q: nesting too deep (recursive template?)", name)
		}
		var buf bytes.Buffer
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, fmt.Errorf("%s", msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["toYaml"] = toYAML
	funcs["mustToYaml"] = func(v interface{}) (string, error) {
		b, err := yaml.Marshal(v)
		return strings.TrimSuffix(string(b), "\n"), err
	}
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["toJson"] = func(v interface{}) string { b, _ := json.Marshal(v); return string(b) }
	funcs["mustToJson"] = func(v interface{}) (string, error) { b, err := json.Marshal(v); return string(b), err }
	funcs["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	// helm template has no cluster: lookup finds nothing.
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		tt, err := template.New("tpl").Option("missingkey=zero").Funcs(funcs).Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = tt.Execute(&buf, data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	t.Funcs(funcs)

	names := make([]string, 0, len(templates))
	for n := range templates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := t.New(n).Parse(templates[n]); err != nil {
			fail("parse error: %v", err)
		}
	}

	release := map[string]interface{}{"Name": o.name, "Namespace": o.namespace, "Revision": 1, "IsInstall": true,
		"IsUpgrade": false, "Service": "Helm"}
	type rendered struct{ source, body, kind string }
	var out []rendered
	var notes string
	for _, n := range names {
		base := path.Base(n)
		if strings.HasPrefix(base, "_") || !(strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml") ||
			strings.HasSuffix(base, ".tpl") || base == "NOTES.txt") {
			continue
		}
		if strings.HasSuffix(base, ".tpl") {
			continue
		}
		data := map[string]interface{}{"Values": values, "Release": release, "Chart": chart, "Capabilities": caps,
			"Files": files, "Template": map[string]interface{}{"Name": n, "BasePath": str("name") + "/templates"}}
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, n, data); err != nil {
			fail("%v", err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if base == "NOTES.txt" {
			notes = text
			continue
		}
		for i, d := range splitDocs(text) {
			var obj map[string]interface{}
			if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
				fail("%s: rendered document %d is not valid YAML: %v\n%s", n, i+1, err, d)
			}
			kind, _ := obj["kind"].(string)
			if kind == "" || obj["apiVersion"] == nil {
				fail("%s: rendered document %d has no kind or apiVersion", n, i+1)
			}
			out = append(out, rendered{n, strings.Trim(d, "\n"), kind})
		}
	}
	if o.notes {
		fmt.Print(notes)
		return
	}
	sort.SliceStable(out, func(i, j int) bool { return installRank(out[i].kind) < installRank(out[j].kind) })
	if o.includeCRDs {
		sort.Strings(crds)
		for _, c := range crds {
			for _, d := range splitDocs(string(files[c])) {
				fmt.Printf("---\n# Source: %s/%s\n%s\n", str("name"), c, strings.Trim(d, "\n"))
			}
		}
	}
	for _, r := range out {
		fmt.Printf("---\n# Source: %s\n%s\n", r.source, r.body)
	}
}

// installRank orders kinds as Helm installs them (pkg/releaseutil InstallOrder); unknown kinds go last.
func installRank(kind string) int {
	order := []string{"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
		"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
		"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
		"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
		"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
		"IngressClass", "Ingress", "APIService"}
	for i, k := range order {
		if k == kind {
			return i
		}
	}
	return len(order)
}
