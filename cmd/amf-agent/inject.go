package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/internal/exitcode"
)

const injectUsage = `Usage: amf-agent inject [-f FILE|-] [--mode sidecar|node] [--admission] [--standby [--spread preferred|required]] [--state-dir DIR] [--container NAME] [--sidecar-image IMAGE] [--probe-mqtt URL] [--model NAME|PATH]

Writes the Deployments of FILE (default: standard input; multi-document YAML)
to standard output with the AMF sidecar injected: native sidecar, projected
ServiceAccount token (audience amf-agent), host cgroup mount, downward API
environment, readiness gate amf.io/healthy and policy annotations. Other kinds
pass through untouched. Injecting twice is the same as injecting once. A broker
with other containers beside it (an exporter) is found by --container, or by its
port named mqtt; a broker without memory or CPU limits is injected with a warning.

With --mode node nothing is injected into the pod template: the Deployment gets
the annotation amf.io/mode=node (and the policy, amf.io/model from --model,
amf.io/container from --container), so applying it restarts no pod, and the
node agent (amf-agent --node-mode) watches its pods from the node.

With --admission the sidecar is left to the admission policy
(manifests/overlays/admission), which writes it into each new pod: the pod
template gets the label amf.io/inject=true and, as annotations, what
--container, --model, --probe-mqtt and --state-dir say (and
amf.io/pause-on-fence for a hot pair). What inject would refuse is refused
all the same. The image is the policy's (ConfigMap amf-system/amf-inject).

With --standby the primary and its standby also get a pod anti-affinity
against each other's pods by node (kubernetes.io/hostname), merged into any
affinity they have: --spread preferred (default) puts them on two nodes when
there are two, on one when there is one (a one-node edge cluster still gets
its standby); --spread required never on one node (the second stays Pending
without another). A hot standby must be off its primary's node to survive
the loss of that node. In node mode only the standby written gets it.

  kubectl get deployment mosquitto -o yaml | amf-agent inject --standby | kubectl apply -f -
  kubectl get deployment mosquitto -o yaml | amf-agent inject --mode node --standby | kubectl apply -f -
  kubectl get deployment mosquitto -o yaml | amf-agent inject --admission --standby | kubectl apply -f -

Flags:
`

// runInject is the inject subcommand; see package inject.
func runInject(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("amf-agent inject", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, injectUsage)
		fs.PrintDefaults()
	}
	var opts inject.Options
	file := fs.String("f", "-", "YAML `file` to read; - is standard input")
	mode := fs.String("mode", string(contract.ModeSidecar), "`mode`: sidecar (inject the sidecar into the pod template) or node (annotate the Deployment only; the node agent watches its pods)")
	fs.BoolVar(&opts.Admission, "admission", false, "leave the sidecar to the admission policy (manifests/overlays/admission): label the pod template amf.io/inject=true and annotate it with the other flags, instead of writing the sidecar into it")
	fs.BoolVar(&opts.Standby, "standby", false, "also write each primary's standby Deployment (0 replicas when amf.io/redundancy is cold)")
	spread := fs.String("spread", string(inject.SpreadPreferred), "with --standby, how the pair is kept off one node: preferred (on two nodes when there are) or required (never on one; the second stays Pending without another node)")
	fs.StringVar(&opts.SidecarImage, "sidecar-image", inject.DefaultSidecarImage, "sidecar `image`")
	fs.StringVar(&opts.ProbeMQTT, "probe-mqtt", "", "sidecar's app-logic probe `URL` (default tcp://127.0.0.1:<the broker's port named mqtt, else 1883>)")
	fs.StringVar(&opts.StateDir, "state-dir", "", "the `folder` of the broker's persistence file (Mosquitto's persistence_location; the eclipse-mosquitto image's is /mosquitto/data): its volume there is mounted into the sidecar, which runs as the broker's user in the pod's process namespace, so that amf-sidecar state save|load can move the broker's state")
	fs.StringVar(&opts.Container, "container", "", "the broker `container` the sidecar watches (default: the one an injected sidecar already watches, else the pod's only container, else the one exposing a port named "+inject.MQTTPortName+")")
	fs.StringVar(&opts.Model, "model", "", "sidecar's `model`: the name of a model embedded in the sidecar image (amf-sidecar --help lists them), or a path inside the sidecar container that you mount there (model file, manifest beside it); default: the image's default model")
	if err := fs.Parse(args); err != nil {
		return parseErr(err)
	}
	if fs.NArg() > 0 {
		return exitcode.Usagef("inject: unexpected arguments %q (use -f FILE)", fs.Args())
	}
	if opts.Admission {
		image := false
		fs.Visit(func(f *flag.Flag) { image = image || f.Name == "sidecar-image" })
		if image {
			return exitcode.Usagef("inject: --sidecar-image with --admission: the admission policy writes the image of its ConfigMap (kubectl -n amf-system edit configmap amf-inject)")
		}
	}
	opts.Mode = contract.Mode(*mode)
	opts.EmbeddedModels = model.EmbeddedNames()
	opts.Spread = inject.Spread(*spread)
	var (
		in  []byte
		err error
	)
	if *file == "-" {
		in, err = io.ReadAll(stdin)
	} else {
		in, err = os.ReadFile(*file)
	}
	if err != nil {
		return exitcode.Usagef("inject: %w", err)
	}
	out, res, err := inject.Inject(in, opts)
	if err != nil {
		return exitcode.Usagef("inject: %w", err)
	}
	if len(res.Injected) == 0 {
		return exitcode.Usagef("inject: no apps/v1 Deployment in the input")
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("inject: %w", err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "amf-agent inject: warning:", w)
	}
	return nil
}
