package nodeloss

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
)

// ClientKind is how a client reaches the pair's broker.
type ClientKind string

// The kinds of Clients: the two ways a user's clients reach a broker.
const (
	// InPod is a client in a pod of its own on a node that survives,
	// connected through the Service's ClusterIP.
	InPod ClientKind = "pod"
	// NodePort is a client outside the cluster (in the lab's LAN), connected
	// through the Service's NodePort on a node that survives.
	NodePort ClientKind = "nodeport"
)

// whoamiTopic holds, retained on each edge broker, that broker's pod name:
// a client reads it on each connection to know which broker it reached.
const whoamiTopic = "amf/lab/whoami"

// Client is one MQTT client of the pair's Service, as a user's device is:
// paho at a keep-alive of its own, publishing QoS 1 to a topic of its own
// every 100 ms and subscribed to it, so that each message it receives is
// the broker serving it.
type Client struct {
	Kind      ClientKind
	KeepAlive time.Duration
	Name      string

	dial func(ctx context.Context, addr string) (net.Conn, error)
	addr string

	mu    sync.Mutex
	mq    paho.Client
	epoch int               // connections made so far
	on    string            // the broker (pod) the current connection reached
	onOf  map[int]string    // the broker each connection reached
	first map[int]time.Time // the first own message received on each connection
	lost  map[int]time.Time // when each connection was lost
	stop  chan struct{}
	done  chan struct{}
}

// Clients are a Pair's directly connected clients: the Service edge-broker
// (NodePort) over both edge brokers, a pod on a node, and in it (and in the
// LAN, through that node's NodePort) a client of each kind at each
// keep-alive.
type Clients struct {
	List []*Client
	cs   kubernetes.Interface
	ns   string
	node *kubenode.Node
	// life is the clients' own lifetime, from StartClients until Stop: a
	// client reconnected by OntoPrimary keeps dialling after the call's
	// context ends (with it, a soak's client moved in one fault could
	// never reconnect after the next).
	life context.Context
	end  context.CancelFunc
}

// StartClients creates the Service (if it is not there yet) and a client
// pod on node and connects the clients, those of the LAN too unless lan is
// nil; Stop ends them.
func (p *Pair) StartClients(ctx context.Context, node *kubenode.Node, lan *kubenode.LAN, keepAlives []time.Duration) (*Clients, error) {
	return startClients(ctx, p.Client, p.Namespace, node, lan, keepAlives)
}

// startClients is StartClients for the edge brokers of namespace ns.
func startClients(ctx context.Context, cs kubernetes.Interface, ns string, node *kubenode.Node, lan *kubenode.LAN, keepAlives []time.Duration) (_ *Clients, err error) {
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-broker"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app.kubernetes.io/name": "edge-broker"},
			Ports: []corev1.ServicePort{{Name: "mqtt", Port: 1883, TargetPort: intstr.FromString("mqtt")}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		svc, err = cs.CoreV1().Services(ns).Get(ctx, "edge-broker", metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("the Service edge-broker: %w", err)
	}
	podName := "clients-" + node.Name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Labels: map[string]string{"app": "clients"}},
		Spec: corev1.PodSpec{NodeName: node.Name,
			Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef, ImagePullPolicy: corev1.PullNever}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("the client pod: %w", err)
	}
	var pid int
	if err := eventually(ctx, "the client pod runs", time.Minute, func() (bool, string) {
		pid, err = node.ContainerPID(ctx, ns, podName, "pause")
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return nil, err
	}
	podNetns := fmt.Sprintf("/proc/%d/ns/net", pid)
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	c := &Clients{cs: cs, ns: ns, node: node, life: life, end: end}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	cluster := net.JoinHostPort(svc.Spec.ClusterIP, "1883")
	nodePort := net.JoinHostPort(node.IP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	for _, ka := range keepAlives {
		for _, k := range []ClientKind{InPod, NodePort} {
			if k == NodePort && lan == nil {
				continue
			}
			cl := &Client{Kind: k, KeepAlive: ka, Name: fmt.Sprintf("%s-%s-%ds", k, node.Name, int(ka.Seconds())),
				onOf: map[int]string{}, first: map[int]time.Time{}, lost: map[int]time.Time{}}
			ns, addr := podNetns, cluster
			if k == NodePort {
				ns, addr = lan.NetNS, nodePort
			}
			cl.addr = addr
			cl.dial = func(ctx context.Context, addr string) (net.Conn, error) { return kubenode.DialIn(ctx, ns, addr) }
			c.List = append(c.List, cl)
			cl.connect(life)
		}
	}
	return c, nil
}

// Stop disconnects every client.
func (c *Clients) Stop() {
	for _, cl := range c.List {
		cl.close()
	}
	c.end()
}

// OntoPrimary tells each edge broker its pod's name (retained on
// whoamiTopic, published in the clients' node's network to the pods' IPs),
// then reconnects each client until it reached pod, the primary: the
// Service spreads connections over both brokers of a hot pair, and a client
// of the standby would not see the primary's loss at all.
func (c *Clients) OntoPrimary(ctx context.Context, pod string) error {
	if err := c.Tell(ctx); err != nil {
		return err
	}
	for _, cl := range c.List {
		for try := 1; ; try++ {
			on, err := cl.waitOn(ctx)
			if err != nil {
				return err
			}
			if on == pod {
				break
			}
			if try == 30 {
				return fmt.Errorf("client %s: %d connections through %s reached %s, never %s", cl.Name, try, cl.addr, on, pod)
			}
			cl.close()
			cl.connect(c.life)
		}
	}
	return nil
}

// Tell tells each edge broker its pod's name (retained on whoamiTopic,
// published in the clients' node's network to the pods' IPs): a client's
// connection knows its broker once it has it, at once or when told later.
func (c *Clients) Tell(ctx context.Context) error {
	pods, err := c.cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=edge-broker"})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		if err := tell(ctx, c.node, net.JoinHostPort(p.Status.PodIP, "1883"), p.Name); err != nil {
			return fmt.Errorf("tell %s its name: %w", p.Name, err)
		}
	}
	return nil
}

// Mark returns what ServedAgain measures from: the current connection.
func (cl *Client) Mark() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.epoch
}

// Marks are the Mark of each client of c, in List's order.
func (c *Clients) Marks() []int {
	var marks []int
	for _, cl := range c.List {
		marks = append(marks, cl.Mark())
	}
	return marks
}

// Describe says what the client has seen since the connection mark: each
// later connection, the broker it reached and whether and when it was
// served and lost (for a client that was not served again).
func (cl *Client) Describe(mark int) string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	open := cl.mq != nil && cl.mq.IsConnectionOpen()
	b := fmt.Sprintf("%s: %d connections after the mark, the current one open %v", cl.Name, cl.epoch-mark, open)
	for e := mark; e <= cl.epoch; e++ {
		b += fmt.Sprintf("; #%d on %q", e, cl.onOf[e])
		if t, ok := cl.first[e]; ok {
			b += " served " + t.UTC().Format("15:04:05.000")
		}
		if t, ok := cl.lost[e]; ok {
			b += " lost " + t.UTC().Format("15:04:05.000")
		}
	}
	return b
}

// ServedAgain returns when the client, after the connection mark, first
// received its own message on a later connection to the broker by (its pod;
// "": any), and when it lost the connection mark; zero times where it has
// not (yet). A later connection to another broker (a crashed primary
// restarted in place before it was retired, say) is not the new primary
// serving it.
func (cl *Client) ServedAgain(mark int, by string) (served, lost time.Time) {
	return cl.ServedAgainBy(mark, func(b string) bool { return by == "" || b == by })
}

// ServedAgainBy is ServedAgain by any broker (pod) that ok accepts; a
// connection whose broker is not known yet is "".
func (cl *Client) ServedAgainBy(mark int, ok func(broker string) bool) (served, lost time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for e, t := range cl.first {
		if e > mark && ok(cl.onOf[e]) && (served.IsZero() || t.Before(served)) {
			served = t
		}
	}
	return served, cl.lost[mark]
}

// connect starts a new paho client (a new connection, so a new pick of the
// Service's endpoints) and its publisher.
func (cl *Client) connect(ctx context.Context) {
	topic := "amf/lab/clients/" + cl.Name
	opts := paho.NewClientOptions().AddBroker("tcp://" + cl.addr).SetClientID("amf-lab-" + cl.Name).
		SetKeepAlive(cl.KeepAlive).SetPingTimeout(10 * time.Second).
		SetAutoReconnect(true).SetMaxReconnectInterval(500 * time.Millisecond).SetConnectTimeout(2 * time.Second).
		SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond).
		SetCustomOpenConnectionFn(func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return cl.dial(dctx, u.Host)
		}).
		SetConnectionLostHandler(func(paho.Client, error) {
			cl.mu.Lock()
			cl.lost[cl.epoch] = time.Now()
			cl.mu.Unlock()
		}).
		SetOnConnectHandler(func(m paho.Client) {
			cl.mu.Lock()
			cl.epoch++
			cl.on = ""
			cl.mu.Unlock()
			m.Subscribe(whoamiTopic, 1, func(_ paho.Client, msg paho.Message) {
				cl.mu.Lock()
				cl.on = string(msg.Payload())
				cl.onOf[cl.epoch] = cl.on
				cl.mu.Unlock()
			})
			m.Subscribe(topic, 1, func(paho.Client, paho.Message) {
				now := time.Now()
				cl.mu.Lock()
				if _, ok := cl.first[cl.epoch]; !ok {
					cl.first[cl.epoch] = now
				}
				cl.mu.Unlock()
			})
		})
	mq := paho.NewClient(opts)
	stop, done := make(chan struct{}), make(chan struct{})
	cl.mu.Lock()
	cl.mq, cl.stop, cl.done, cl.on = mq, stop, done, "" // the broker is the new connection's to tell
	cl.mu.Unlock()
	mq.Connect()
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if mq.IsConnectionOpen() {
					mq.Publish(topic, 1, false, time.Now().Format(time.RFC3339Nano))
				}
			}
		}
	}()
}

// waitOn waits until the current connection knows its broker.
func (cl *Client) waitOn(ctx context.Context) (string, error) {
	var on string
	err := eventually(ctx, "client "+cl.Name+" connected and told its broker", 30*time.Second, func() (bool, string) {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		on = cl.on
		return on != "", fmt.Sprintf("%d connections through %s", cl.epoch, cl.addr)
	})
	return on, err
}

func (cl *Client) close() {
	cl.mu.Lock()
	mq, stop, done := cl.mq, cl.stop, cl.done
	cl.mq = nil
	cl.mu.Unlock()
	if mq == nil {
		return
	}
	close(stop)
	<-done
	mq.Disconnect(0)
}

// tell publishes a broker's own name to it, retained on whoamiTopic.
func tell(ctx context.Context, node *kubenode.Node, addr, name string) error {
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("amf-lab-whoami").SetConnectTimeout(5 * time.Second).
		SetCustomOpenConnectionFn(func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return kubenode.DialIn(dctx, node.NetNS, u.Host)
		})
	mq := paho.NewClient(opts)
	if t := mq.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return errors.Join(errors.New("connect"), t.Error())
	}
	defer mq.Disconnect(100)
	if t := mq.Publish(whoamiTopic, 1, true, name); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return errors.Join(errors.New("publish"), t.Error())
	}
	return nil
}

// Served waits (at most wait after from: the fault, or the heal) until
// every client is served again by the broker by (its pod; "": any) on a
// connection after its mark, and returns each one's figures, seconds after
// from.
func (c *Clients) Served(ctx context.Context, marks []int, from time.Time, wait time.Duration, by string) []ClientCut {
	return c.ServedBy(ctx, marks, from, wait, func(b string) bool { return by == "" || b == by })
}

// ServedBy is Served by any broker (pod) that ok accepts.
func (c *Clients) ServedBy(ctx context.Context, marks []int, from time.Time, wait time.Duration, ok func(broker string) bool) []ClientCut {
	_ = eventually(ctx, "every client served again", wait-time.Since(from), func() (bool, string) {
		for i, cl := range c.List {
			if s, _ := cl.ServedAgainBy(marks[i], ok); s.IsZero() {
				return false, cl.Name + " not yet"
			}
		}
		return true, ""
	})
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return -1
		}
		return t.Sub(from).Seconds()
	}
	var out []ClientCut
	for i, cl := range c.List {
		served, lost := cl.ServedAgainBy(marks[i], ok)
		out = append(out, ClientCut{Client: cl.Name, Kind: cl.Kind, KeepAlive: cl.KeepAlive.Seconds(), LostS: since(lost), ServedS: since(served)})
	}
	return out
}
