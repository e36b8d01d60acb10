// Package model loads AMF's anomaly model and scores feature vectors with it.
//
// A model is a LightGBM v2/v3 text file (objective "binary sigmoid:1", the
// form infer/train/amftrain.py exports from scikit-learn's
// HistGradientBoostingClassifier) plus a JSON manifest. Scoring goes through
// github.com/dmitryikh/leaves.
//
// One embedded detector has no trees: predict-linear, the Prometheus rule
// predict_linear(memory_bytes[W], H) / memory_limit_bytes * 100 >= 100 that an
// operator would write (linear.go). Its manifest has model_format
// FormatPredictLinear and its model file is that PromQL line; it scores the
// feature engine's memory projection (ScoreSample), not the six features.
//
// # Explanations
//
// Explain attributes a tree model's raw score to the features by Saabas' path
// attribution (explain.go): bias + contributions = Raw. Why renders the top
// three for logs and /status; for predict-linear it is the line's time to the
// limit (SecondsToLimit).
//
// # Files
//
// Models are embedded by name (EmbeddedNames, Embedded): DefaultName
// "leadtime", the lab's choice (leadtime_model.txt; `make leadtime` trains it
// and chooses the default), is what Default returns; PaperName "p1" is the
// paper's P1 model (p1_model.txt, p1_manifest.json; `make model`);
// "predict-linear" is the rule an operator writes instead. Adding an embedded model is
// one entry in the registry in embedded.go beside its files. A model given on
// the command line is an embedded name or else a file NAME.txt whose
// manifest is NAME.manifest.json in the same folder (LoadNameOrPath,
// ManifestPathFor); an exact embedded name wins, so "./p1" names a file
// called p1. LoadFilePair takes both paths explicitly.
//
// # Checks
//
// Every model, embedded or not, passes the same checks before it can score:
// size (at most MaxModelBytes, manifest at most MaxManifestBytes), manifest
// schema and values, feature names and count equal to contract.FeatureNames, sha256
// of the model bytes equal to the manifest's, and a full structural
// validation of the text (header, objective, every tree's arrays, child
// links forming one tree, feature indices, finite leaf values) before the
// bytes reach leaves, which runs under recover. After leaves has loaded the
// model, its raw scores on probe vectors are compared bit for bit with this
// package's own reading of the trees. Every failure is a *LoadError naming
// the file, what is wrong and what to do; errors.Is works with ErrEmpty,
// ErrTooLarge, ErrManifest, ErrFeatures, ErrFeatureSpec, ErrChecksum,
// ErrFormat, ErrLeaves and ErrIO, and ErrNoSuchModel for a name that is
// neither an embedded model nor a file.
//
// # Feature spec
//
// Model and features travel together: the manifest states the feature names
// in order, the windows the training features were computed with (rate
// window, deriv window, subquery step, lookback, and the sample interval of
// the training data) and the normalisation (FeatureSpec). The sidecar builds
// its feature pipeline from them, never from its own settings. The loader
// refuses a spec the feature engine cannot compute (Windows.Check, kind
// ErrFeatureSpec); Windows.CheckInterval says whether a sampling interval
// can feed the model. A schema_version 1 manifest, written before the spec
// was complete, loads with the P1 pipeline's values for what it does not
// state (P1Windows), and Model.Warnings names the manifest.
//
// Score takes a *[contract.NumFeatures]float64, so a short vector (on which leaves
// would silently return 0) cannot be passed. NaN means "missing" and follows
// the missing-value direction the trainer learned.
//
// # Override and fallback
//
// LoadOverride(nameOrPath) is for the sidecar's --model flag: when the
// override is unusable (a bad file, an unknown name) it returns the embedded
// default model together with the error, so the sidecar keeps running and
// reports the rejection (log, status, metric) instead of crash-looping.
//
// # Data attribution
//
// The embedded model p1 is derived from the ToD-K8s-OOD dataset by
// Hassaan Siddiqui and Ferhat Khendek, licensed CC BY 4.0
// (https://github.com/hassaanas/k8s-dataset-tod); its manifest records the
// dataset's name, authors, licence and file checksums.
package model
