/* checkpoint: (to be written) */
